"""Truncate-and-reload in one transaction, streamed one change per chunk, on a real server.

After a TRUNCATE, PostgreSQL sends the table's RELATION again in every stream chunk
(``S R I E`` per chunk with ``debug_logical_replication_streaming = immediate``): a
100,000-row reload is 100,000 chunks and as many RELATION messages. Receiving it once
went quadratic in the chunks and did not finish in ten minutes (``Mirror.run``'s
deadline stops a hang; ``bench/reload_bench.py`` measures the time). The stager is on
with small pieces, so every chunk close asks it what is in effect, and a second table
loaded in the same transaction is staged from pieces that start after many of those
RELATION messages.
"""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from tests.conftest import PgServer
from tests.mirror import Mirror

pytestmark = pytest.mark.integration

ROWS = 100_000
PIECE = 64 * 1024  # bytes of spool per staged piece


def test_truncate_and_reload_in_one_streamed_transaction(
    mirror: Mirror, pg_server: PgServer
) -> None:
    m = mirror
    m.config = dataclasses.replace(
        m.config, apply=dataclasses.replace(m.config.apply, stage_bytes=PIECE)
    )
    m.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE u (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t, u",
        "INSERT INTO t SELECT g, 'old' FROM generate_series(1, 3000) g",
    )
    m.run()
    pg_server.set_streaming("immediate")
    try:
        with psycopg.connect(m.dsn) as conn:
            conn.execute("TRUNCATE t")
            conn.execute(
                "INSERT INTO t SELECT g, 'new ' || g FROM generate_series(2001, %s::int) g",
                (2000 + ROWS,),
            )
            conn.execute("SAVEPOINT s")  # its rows are chunks of their own, then cut off
            conn.execute("INSERT INTO t SELECT g, 'aborted' FROM generate_series(1, 500) g")
            conn.execute("ROLLBACK TO SAVEPOINT s")
            conn.execute("INSERT INTO u SELECT g, 'u' FROM generate_series(1, 3000) g")
        summary = m.run()
    finally:
        pg_server.set_streaming("buffered")
    m.assert_mirrored("public.t", "public.u")
    assert summary.changes == ROWS + 3000, summary
    assert summary.staged_rows > 0, summary  # u's pieces were used
