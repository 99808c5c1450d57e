"""The one SQL connection to the publisher: a failure to connect names the server,
never the password or the connection string."""

from __future__ import annotations

import socket

import psycopg
import pytest

from sparkapply.errors import ErrorKind, SourceError
from sparkapply.source.connection import connect


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_connection_is_a_source_error_naming_the_server() -> None:
    port = _closed_port()
    dsn = f"host=127.0.0.1 port={port} dbname=shop user=app password=s3cret-pw"
    with pytest.raises(SourceError) as info:
        connect(dsn, application_name="sparkapply test", connect_timeout=2)
    err = info.value
    text = str(err)
    assert f"cannot connect to the publisher 127.0.0.1:{port}/shop as app" in text
    assert "check [source] dsn" in text
    assert "s3cret-pw" not in text and dsn not in text
    assert err.kind is ErrorKind.OPERATOR
    assert isinstance(err.__cause__, psycopg.OperationalError)
