"""``sparkapply skip`` without a reachable publisher: the skip is recorded unchecked,
and the warning names the server and psycopg's reason, never the password."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from sparkapply.commands.skip import request_skip
from sparkapply.config import Config, load_config
from sparkapply.errors import ConfigError
from sparkapply.lsn import Lsn


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(work: Path, dsn: str) -> Config:
    return load_config(
        env={},
        overrides={
            "work_dir": str(work),
            "source": {"dsn": dsn, "publication": "pub", "connect_timeout": 2},
        },
    )


def test_an_unreachable_publisher_records_the_skip_unchecked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = _closed_port()
    dsn = f"host=127.0.0.1 port={port} dbname=shop user=app password=s3cret-pw"
    config = _config(tmp_path / "work", dsn)
    with caplog.at_level(logging.WARNING):
        assert request_skip(config, "0/3A1C2F8") == Lsn.parse("0/3A1C2F8")
    warning = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"on 127.0.0.1:{port}/shop as app (" in warning
    assert "recording the skip without checking it" in warning
    assert "cannot connect to the publisher" not in warning  # psycopg's reason, as before
    assert "s3cret-pw" not in warning
    assert (tmp_path / "work" / "skip.json").exists()


def test_a_bad_lsn_is_a_config_error(tmp_path: Path) -> None:
    config = _config(tmp_path, f"host=127.0.0.1 port={_closed_port()} dbname=shop")
    with pytest.raises(ConfigError, match="--lsn must be an LSN"):
        request_skip(config, "not-an-lsn")
    with pytest.raises(ConfigError, match="names no transaction"):
        request_skip(config, "0/0")
