"""The harness itself: the server is real, new enough and set up for logical replication."""

from __future__ import annotations

import psycopg

from tests.conftest import PgServer


def test_server_is_logical_and_new_enough(pg_server: PgServer, pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        version = conn.info.server_version
        wal_level = conn.execute("SHOW wal_level").fetchone()
        prepared = conn.execute("SHOW max_prepared_transactions").fetchone()
    assert version >= 160000
    assert wal_level == ("logical",)
    assert prepared is not None and int(prepared[0]) > 0
