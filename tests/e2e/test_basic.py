"""End to end: PostgreSQL → sparkapply → Iceberg, compared row by row."""

from __future__ import annotations

import pytest

from sparkapply.run.batch import BatchStats
from tests.conftest import PgServer
from tests.mirror import Mirror

pytestmark = pytest.mark.integration


def test_insert_update_delete(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(10,2))",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()  # creates the slot; nothing to apply yet
    mirror.sql(
        "INSERT INTO t SELECT g, 'v' || g, g / 3.0 FROM generate_series(1, 500) g",
        "UPDATE t SET v = 'changed' WHERE id % 10 = 0",
        "DELETE FROM t WHERE id % 7 = 0",
        "UPDATE t SET id = id + 1000 WHERE id BETWEEN 1 AND 5",
    )
    batches: list[BatchStats] = []
    summary = mirror.run(on_batch=batches.append)
    mirror.assert_mirrored("public.t")
    # The timings the package records for benchmarks and operators.
    assert batches and summary.streaming_started > 0
    for stats in batches:
        assert summary.streaming_started < stats.started < stats.finished
        assert stats.plan_seconds > 0 and stats.job_seconds > 0 and stats.commit_seconds > 0
        assert stats.job_seconds < stats.finished - stats.started
        (result,) = stats.results
        inserts_only = result.path == "insert-only"
        phases = {"decode", "write"} if inserts_only else {"fold", "locate", "write"}
        assert set(result.timings) == phases
        assert all(seconds >= 0 for seconds in result.timings.values())


def test_old_snapshots_are_expired_and_the_lsn_survives(mirror: Mirror) -> None:
    from dataclasses import replace

    # The sink's own retention, alone: a compaction after the last batch would add a
    # snapshot after the expiry or not, depending on timing (tests/maintain covers it);
    # the cuts of the last minutes keep their snapshots (tests/e2e/test_cuts.py).
    mirror.config = replace(
        mirror.config,
        sink=replace(mirror.config.sink, retain_snapshots=2, cuts_table=""),
        maintenance=replace(mirror.config.maintenance, enabled=False),
    )
    mirror.sql("CREATE TABLE t (id int PRIMARY KEY, v int)", "CREATE PUBLICATION pub FOR TABLE t")
    mirror.run()
    for i in range(6):  # one batch each
        mirror.sql(f"INSERT INTO t VALUES ({i}, {i})", f"UPDATE t SET v = v + 1 WHERE id < {i}")
        mirror.run()
    table = mirror.catalog.load_table(("public", "t"))
    assert len(table.metadata.snapshots) <= 3
    mirror.assert_mirrored("public.t")
    mirror.sql("DELETE FROM t WHERE id = 0")
    mirror.run()  # a new subscriber reads the applied LSN back after expiry
    mirror.assert_mirrored("public.t")


def test_the_applys_own_expiry_runs_beside_it_with_maintenance_on(mirror: Mirror) -> None:
    """With maintenance on, the expiry that keeps commits cheap runs on maintenance's
    thread (it read manifests and deleted files for about a second a table on the
    apply thread, before the batch was acknowledged): snapshots stay bounded."""
    from dataclasses import replace

    mirror.config = replace(
        mirror.config, sink=replace(mirror.config.sink, retain_snapshots=2, cuts_table="")
    )
    mirror.sql("CREATE TABLE t (id int PRIMARY KEY, v int)", "CREATE PUBLICATION pub FOR TABLE t")
    mirror.run()
    for i in range(8):  # one batch each
        mirror.sql(f"INSERT INTO t VALUES ({i}, {i})", f"UPDATE t SET v = v + 1 WHERE id < {i}")
        mirror.run()
    table = mirror.catalog.load_table(("public", "t"))
    assert len(table.metadata.snapshots) <= 5, len(table.metadata.snapshots)
    mirror.assert_mirrored("public.t")


def test_keepalives_answered_while_spark_works(mirror: Mirror, pg_server: PgServer) -> None:
    """With wal_sender_timeout = 1 s the walsender drops a subscriber that stays silent
    for a second; a multi-second apply must not make it (no reconnect)."""
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE u (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t, u",
    )
    mirror.run()
    pg_server.set_setting("wal_sender_timeout", "1s")
    try:
        for table in ("t", "u"):  # updates: the slow, row-by-row path
            mirror.sql(
                f"INSERT INTO {table} SELECT g, 'v' FROM generate_series(1, 60000) g",
                f"UPDATE {table} SET v = 'w' WHERE id % 2 = 0",
            )
        summary = mirror.run()
    finally:
        pg_server.set_setting("wal_sender_timeout", "20s")
    assert summary.reconnects == 0
    assert summary.changes >= 2 * 90000
    mirror.assert_mirrored("public.t", "public.u")
