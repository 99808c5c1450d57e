"""A published table dropped while the publisher's catalog is read: every read of
``pg_publication_tables`` (``source.publisher.publication_rows``) leaves it out, as
a table no longer published, instead of failing."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from sparkapply.copy.snapshot import describe_tables, published_tables
from sparkapply.source.publisher import check_publisher


def _read_while_dropped(
    pg_dsn: str, read: Any, *, in_transaction: bool
) -> tuple[Any, psycopg.Connection[Any]]:
    """``read(conn)`` while another session drops a published table: the reader lists
    it, then waits for the DROP's lock to open it, and the DROP commits (the race that
    fails a read of ``pg_publication_tables`` with "could not open relation"; a run
    stopped on it in CI, checking the publisher while a test dropped a table)."""
    conn = psycopg.connect(pg_dsn, autocommit=True)
    dropper = psycopg.connect(pg_dsn, autocommit=True)
    watcher = psycopg.connect(pg_dsn, autocommit=True)
    dropper.execute("CREATE TABLE gone (id int PRIMARY KEY)")
    dropper.execute("CREATE TABLE kept (id int PRIMARY KEY)")
    dropper.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    row = dropper.execute("SELECT 'gone'::regclass::oid").fetchone()
    assert row is not None
    if in_transaction:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    dropper.execute("BEGIN")
    dropper.execute("DROP TABLE gone")
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.append(read(conn)))
    reader.start()
    waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s"
    deadline = time.monotonic() + 30
    while not watcher.execute(waiting, (row[0],)).fetchone()[0]:  # type: ignore[index]
        assert time.monotonic() < deadline, "the read never waited for the DROP's lock"
        time.sleep(0.01)
    dropper.execute("COMMIT")
    reader.join(30)
    dropper.close()
    watcher.close()
    assert out, "the read raised"
    return out[0], conn


@pytest.mark.integration
def test_a_table_dropped_while_the_publication_is_read_is_not_published(pg_dsn: str) -> None:
    names, conn = _read_while_dropped(
        pg_dsn, lambda c: published_tables(c, ["pub"]), in_transaction=False
    )
    conn.close()
    assert names == [("public", "kept")]


@pytest.mark.integration
def test_a_table_dropped_while_the_copy_describes_its_snapshot_is_left_out(pg_dsn: str) -> None:
    tables, conn = _read_while_dropped(
        pg_dsn, lambda c: describe_tables(c, ["pub"]), in_transaction=True
    )
    assert [t.key for t in tables] == [("public", "kept")]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # still usable
    assert conn.execute("SELECT 1").fetchone() == (1,)
    conn.execute("COMMIT")
    conn.close()


@pytest.mark.integration
def test_a_table_dropped_while_the_publisher_is_checked_is_not_published(pg_dsn: str) -> None:
    checked, conn = _read_while_dropped(
        pg_dsn, lambda _: check_publisher(pg_dsn, ["pub"]), in_transaction=False
    )
    conn.close()
    assert [t.qualified for t in checked[1]] == ["public.kept"]
