"""Two-phase commit: prepared transactions committed, rolled back, streamed, restarted."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import PgServer
from tests.mirror import Mirror, prepare_transaction

pytestmark = pytest.mark.integration


def test_prepared_commit_rollback_empty_reused_gid(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE other (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    prepare_transaction(
        mirror.dsn, "g1", "INSERT INTO t SELECT g, 'p1' FROM generate_series(1, 100) g"
    )
    prepare_transaction(
        mirror.dsn, "g2", "INSERT INTO t SELECT g, 'p2' FROM generate_series(101, 200) g"
    )
    prepare_transaction(mirror.dsn, "empty", "INSERT INTO other VALUES (1)")  # nothing published
    mirror.sql("INSERT INTO t VALUES (1000, 'ordinary, between')")
    mirror.sql("ROLLBACK PREPARED 'g2'", "COMMIT PREPARED 'g1'", "COMMIT PREPARED 'empty'")
    # The same GID again, for a different transaction.
    prepare_transaction(mirror.dsn, "g1", "UPDATE t SET v = 'reused gid' WHERE id <= 10")
    mirror.sql("COMMIT PREPARED 'g1'")
    mirror.run()
    mirror.assert_mirrored("public.t")


def test_restart_between_prepare_and_commit_prepared(mirror: Mirror, pg_server: PgServer) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    prepare_transaction(
        mirror.dsn, "later", "INSERT INTO t SELECT g, 'prepared' FROM generate_series(1, 50) g"
    )
    prepare_transaction(mirror.dsn, "undone", "INSERT INTO t VALUES (999, 'rolled back later')")
    pg_server.set_streaming("immediate")
    try:
        # A streamed prepared transaction (STREAM PREPARE).
        prepare_transaction(
            mirror.dsn, "streamed", "INSERT INTO t SELECT g, 's' FROM generate_series(51, 300) g"
        )
    finally:
        pg_server.set_streaming("buffered")
    with psycopg.connect(mirror.dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    after_prepares = row[0]
    mirror.run()  # stages all three and acknowledges past their PREPAREs
    with psycopg.connect(mirror.dsn) as conn:
        acked = conn.execute(
            "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (after_prepares, mirror.slot),
        ).fetchone()
    assert acked == (True,)  # the slot no longer holds WAL for the prepared transactions
    staged = sorted(p.name for p in (mirror.config.work_dir / "prepared").glob("*.json"))
    assert len(staged) == 3, staged
    # A new subscriber (a restart) sees only COMMIT/ROLLBACK PREPARED.
    mirror.sql(
        "COMMIT PREPARED 'later'", "ROLLBACK PREPARED 'undone'", "COMMIT PREPARED 'streamed'"
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
    assert not list((mirror.config.work_dir / "prepared").glob("*.json"))
