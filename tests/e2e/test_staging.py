"""Streamed transactions staged while they arrive (apply/stager.py), on a real server.

The server streams every change at once (``debug_logical_replication_streaming =
immediate``) and the stager stages every few kilobytes, so a transaction of a few
thousand rows is staged in many pieces while it is received. Each test compares the
tables with the publisher and checks what staging did: used where the tables only
received inserts, discarded (and the transaction applied from the spool) otherwise,
and no staged file is left that no snapshot references.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sparkapply.maintain.command import run_maintain
from sparkapply.run.batch import BatchStats
from sparkapply.run.subscriber import Subscriber
from sparkapply.sink.maintenance import referenced_files
from sparkapply.staging.records import waiting_files
from tests.conftest import PgServer
from tests.mirror import Mirror, Running, wait_until

pytestmark = pytest.mark.integration

PIECE = 64 * 1024  # bytes of spool per staged piece in these tests


@pytest.fixture()
def staging(mirror: Mirror, pg_server: PgServer) -> Iterator[Mirror]:
    pg_server.set_streaming("immediate")
    cfg = mirror.config
    mirror.config = dataclasses.replace(
        cfg, apply=dataclasses.replace(cfg.apply, stage_bytes=PIECE)
    )
    yield mirror
    pg_server.set_streaming("buffered")


def _data_files(mirror: Mirror) -> set[str]:
    """Every Parquet file under the warehouse."""
    root = Path(str(mirror.config.work_dir)) / "warehouse"
    return {str(p) for p in root.rglob("*.parquet")}


def _unreferenced(mirror: Mirror, *tables: str) -> set[str]:
    keep: set[str] = set()
    for name in (*tables, "sparkapply.cuts"):  # every batch records a cut
        ns, table = name.split(".")
        keep |= referenced_files(mirror.catalog.load_table((ns, table)))
    return {p for p in _data_files(mirror) if p not in keep}


def test_bulk_insert_is_staged_and_committed(staging: Mirror) -> None:
    m = staging
    m.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(10,2))",
        "CREATE TABLE u (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t, u",
    )
    m.run()
    with psycopg.connect(m.dsn) as conn:
        conn.execute(
            "INSERT INTO t SELECT g, repeat('x', g % 50), g / 7.0 FROM generate_series(1, 6000) g"
        )
        conn.execute("INSERT INTO u SELECT g, 'u' FROM generate_series(1, 3000) g")
        conn.execute("INSERT INTO t SELECT g, 'late', 0 FROM generate_series(6001, 6100) g")
    summary = m.run()
    m.assert_mirrored("public.t", "public.u")
    assert summary.staged_rows > 4000, summary
    assert summary.changes == 9100
    assert not _unreferenced(m, "public.t", "public.u")
    assert not list((Path(str(m.config.work_dir)) / "staging").glob("*.json"))


def test_subtransaction_aborts_after_their_pieces_were_staged(staging: Mirror) -> None:
    m = staging
    m.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION pub FOR TABLE t")
    m.run()
    with psycopg.connect(m.dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, 'top' FROM generate_series(1, 2000) g")
        conn.execute("SAVEPOINT a")
        conn.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(2001, 4000) g")
        conn.execute("SAVEPOINT b")
        conn.execute("INSERT INTO t SELECT g, 'b' FROM generate_series(4001, 6000) g")
        conn.execute("ROLLBACK TO SAVEPOINT b")  # long after b's rows were staged
        conn.execute("INSERT INTO t SELECT g, 'after b' FROM generate_series(6001, 7000) g")
        conn.execute("RELEASE SAVEPOINT a")
        conn.execute("SAVEPOINT c")
        conn.execute("INSERT INTO t SELECT g, 'c' FROM generate_series(7001, 9000) g")
        conn.execute("ROLLBACK TO SAVEPOINT c")
    summary = m.run()
    m.assert_mirrored("public.t")
    assert summary.staged_rows > 1000, summary
    assert not _unreferenced(m, "public.t")


def test_a_transaction_that_updates_is_applied_from_the_spool(staging: Mirror) -> None:
    m = staging
    m.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE u (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t, u",
    )
    m.run()
    with psycopg.connect(m.dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 4000) g")
        conn.execute("INSERT INTO u SELECT g, 'y' FROM generate_series(1, 4000) g")
        # Late in the transaction: t's staged files cannot be used, u's can.
        conn.execute("UPDATE t SET v = 'updated' WHERE id % 7 = 0")
        conn.execute("DELETE FROM t WHERE id % 11 = 0")
    summary = m.run()
    m.assert_mirrored("public.t", "public.u")
    assert 0 < summary.staged_rows <= 4000, summary  # u only
    assert not _unreferenced(m, "public.t", "public.u")


def test_ddl_inside_a_streamed_transaction_stops_its_staging(staging: Mirror) -> None:
    m = staging
    m.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION pub FOR TABLE t")
    m.run()
    with psycopg.connect(m.dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, 'before' FROM generate_series(1, 3000) g")
        conn.execute("ALTER TABLE t ADD COLUMN w int")
        conn.execute("INSERT INTO t SELECT g, 'after', g FROM generate_series(3001, 6000) g")
    m.run()
    m.assert_mirrored("public.t")
    assert not _unreferenced(m, "public.t")


def test_interleaved_streams_and_a_top_abort(staging: Mirror) -> None:
    m = staging
    m.sql(
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE a, b",
    )
    m.run()
    with (
        psycopg.connect(m.dsn) as s1,
        psycopg.connect(m.dsn) as s2,
        psycopg.connect(m.dsn) as s3,
    ):
        for chunk in range(4):
            lo, hi = chunk * 1000 + 1, chunk * 1000 + 1000
            s1.execute(
                "INSERT INTO a SELECT g, 's1' FROM generate_series(%s::int, %s::int) g", (lo, hi)
            )
            s2.execute(
                "INSERT INTO b SELECT g, 's2' FROM generate_series(%s::int, %s::int) g", (lo, hi)
            )
            s3.execute(
                "INSERT INTO a SELECT g, 's3' FROM generate_series(%s::int, %s::int) g",
                (lo + 50000, hi + 50000),
            )
        s3.rollback()  # staged, then aborted
        s2.commit()
        s1.commit()
    summary = m.run()
    m.assert_mirrored("public.a", "public.b")
    assert summary.staged_rows > 2000, summary
    assert not _unreferenced(m, "public.a", "public.b")


def test_stream_prepare_restart_then_commit_prepared(staging: Mirror) -> None:
    m = staging
    m.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION pub FOR TABLE t")
    m.run()
    with psycopg.connect(m.dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, 'p' FROM generate_series(1, 5000) g")
        conn.execute("PREPARE TRANSACTION 'staged-gid'")
    m.run()  # staged while it arrived, then STREAM PREPARE: kept with the prepared store
    records = list((Path(str(m.config.work_dir)) / "prepared").glob("*.staged.json"))
    assert len(records) == 1
    m.run()  # a restart in between: the sweep keeps the prepared transaction's files
    m.sql("COMMIT PREPARED 'staged-gid'")
    summary = m.run()
    m.assert_mirrored("public.t")
    assert summary.staged_rows > 2500, summary
    assert not records[0].exists()
    assert not _unreferenced(m, "public.t")


def test_rollback_prepared_deletes_the_staged_files(staging: Mirror) -> None:
    m = staging
    m.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION pub FOR TABLE t")
    m.run()
    m.sql("INSERT INTO t VALUES (0, 'kept')")
    before = _data_files(m)
    with psycopg.connect(m.dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, 'p' FROM generate_series(1, 5000) g")
        conn.execute("PREPARE TRANSACTION 'doomed-gid'")
    m.run()
    assert len(_data_files(m) - before) > 1  # staged files are waiting
    m.sql("ROLLBACK PREPARED 'doomed-gid'")
    m.run()
    m.assert_mirrored("public.t")
    assert not _unreferenced(m, "public.t")
    assert not list((Path(str(m.config.work_dir)) / "prepared").glob("*.staged.json"))


def _settle(m: Mirror, quiet: float = 2.0, limit: float = 30.0) -> None:
    """Wait until the killed run's leftovers stop writing: its JVM and Python workers
    outlive the killed driver by a moment, and a piece in flight may still finish its
    file (a restart that comes sooner leaves that file to the orphan sweep)."""
    deadline = time.monotonic() + limit
    seen = _data_files(m)
    still = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _data_files(m)
        if now != seen:
            seen, still = now, time.monotonic()
        elif time.monotonic() - still >= quiet:
            return


def test_kill_while_pieces_are_staged_then_restart(staging: Mirror, tmp_path: Path) -> None:
    m = staging
    m.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION pub FOR TABLE t")
    m.run()
    with psycopg.connect(m.dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, repeat('k', 20) FROM generate_series(1, 8000) g")
    m.run_killed("piece-staged:3", tmp_path, stage_bytes=PIECE)
    _settle(m)
    journal = Path(str(m.config.work_dir)) / "staging"
    assert list(journal.glob("*.json")), "the kill left no journalled piece to sweep"
    left = _data_files(m)
    m.run()
    m.assert_mirrored("public.t")
    # The killed run's staged files were swept at the restart, none is left unreferenced.
    assert left - _data_files(m), "no staged file of the killed run was removed"
    assert not _unreferenced(m, "public.t")
    assert not list(journal.glob("*.json"))


def test_a_streamed_update_is_staged_by_key(staging: Mirror) -> None:
    m = staging
    m.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, n int)",
        "CREATE PUBLICATION pub FOR TABLE t",
        "INSERT INTO t SELECT g, 'before', g FROM generate_series(1, 6000) g",
    )
    m.run()
    with psycopg.connect(m.dsn) as conn:
        # Each row changed once, in pieces: netted by key while they arrive.
        conn.execute("UPDATE t SET v = 'updated', n = n + 1 WHERE id <= 3000")
        conn.execute("DELETE FROM t WHERE id > 5500")
        conn.execute("UPDATE t SET id = id + 100000 WHERE id BETWEEN 4000 AND 4100")
        conn.execute("INSERT INTO t SELECT g, 'new', 0 FROM generate_series(6001, 7000) g")
        conn.execute("DELETE FROM t WHERE id BETWEEN 5001 AND 5010")  # at the end
    batches: list[BatchStats] = []
    summary = m.run(on_batch=batches.append)
    m.assert_mirrored("public.t")
    assert summary.staged_rows > 2000, summary
    # The per-operation counts (the rows_applied metric) are the source's changes,
    # staged pieces' included: 3,000 + 101 updates, 500 + 10 deletes, 1,000 inserts.
    (result,) = [r for b in batches for r in b.results if r.table == "public.t"]
    assert (result.n_inserts, result.n_updates, result.n_deletes) == (1000, 3101, 510)
    assert (result.path, result.tasks) == ("staged-keyed", 2)  # composed by key in 2 tasks
    assert not _unreferenced(m, "public.t")
    assert not list((Path(str(m.config.work_dir)) / "staging").glob("*.json"))


# Many rows changed twice: every key partition finds a conflict; one row: one does,
# and what the others wrote is deleted.
@pytest.mark.parametrize("again", ["id % 10 = 0", "id = 7"])
def test_a_streamed_update_that_changes_rows_twice_is_applied_from_the_spool(
    staging: Mirror, again: str
) -> None:
    m = staging
    m.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t",
        "INSERT INTO t SELECT g, 'before' FROM generate_series(1, 8000) g",
    )
    m.run()
    with psycopg.connect(m.dsn) as conn:
        conn.execute("UPDATE t SET v = 'first' WHERE id <= 6000")  # several pieces
        conn.execute(f"UPDATE t SET v = 'second' WHERE {again}")  # pieces later
        conn.execute("DELETE FROM t WHERE id % 25 = 0 AND id > 7000")  # rows not changed yet
    summary = m.run()
    m.assert_mirrored("public.t")
    assert summary.staged_rows == 0, summary  # the pieces did not compose
    assert not _unreferenced(m, "public.t")


def test_a_prepared_streamed_update_is_staged_by_key(staging: Mirror) -> None:
    m = staging
    m.sql(
        "CREATE TABLE t (id bigint PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t",
        "INSERT INTO t SELECT g, 'before' FROM generate_series(1, 5000) g",
    )
    m.run()
    with psycopg.connect(m.dsn) as conn:
        conn.execute("UPDATE t SET v = 'prepared' WHERE id % 2 = 0")
        conn.execute("DELETE FROM t WHERE id % 2 = 1 AND id > 4000")
        conn.execute("PREPARE TRANSACTION 'keyed-gid'")
    m.run()
    records = list((Path(str(m.config.work_dir)) / "prepared").glob("*.staged.json"))
    assert len(records) == 1
    m.run()  # a restart: the record keeps the pieces' files, removes included
    waiting = waiting_files(Path(str(m.config.work_dir)))
    assert any(f.endswith("-keys.parquet") for f in waiting)
    # An orphan sweep with no grace at all, while COMMIT PREPARED has not come: the
    # waiting files stay (they are no snapshot's yet), the other orphans go.
    orphan = Path(next(iter(waiting)).removeprefix("file://")).with_name("stray.parquet")
    orphan.write_bytes(b"PAR1")
    no_grace = dataclasses.replace(
        m.config,
        maintenance=dataclasses.replace(m.config.maintenance, orphan_grace_seconds=-60.0),
    )
    run_maintain(no_grace, table="public.t")
    assert not orphan.exists()
    assert all(Path(f.removeprefix("file://")).exists() for f in waiting)
    m.sql("COMMIT PREPARED 'keyed-gid'")
    summary = m.run()
    m.assert_mirrored("public.t")
    assert summary.staged_rows > 1000, summary
    assert not _unreferenced(m, "public.t")


def test_the_orphan_sweep_keeps_a_running_transactions_staged_files(staging: Mirror) -> None:
    """A streamed transaction's pieces are staged while it runs, and no snapshot
    references their files until it commits, which may be hours later. An orphan
    sweep meanwhile (here with no grace at all, from ``sparkapply maintain``) keeps
    them: the journal names them. Before, it deleted them, and the commit stopped
    the run ("data file to add does not exist")."""
    m = staging
    m.sql(
        "CREATE TABLE t (id bigint PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    m.run()
    journal = Path(str(m.config.work_dir)) / "staging"
    before = _data_files(m)
    running = Running(Subscriber(m.config, spark=m.spark, catalog=m.catalog))
    try:
        with psycopg.connect(m.dsn) as conn:
            conn.execute("INSERT INTO t SELECT g, 'running' FROM generate_series(1, 6000) g")
            wait_until(
                lambda: any(journal.glob("*.json")) and bool(_data_files(m) - before),
                "pieces to be staged",
            )
            staged = _data_files(m) - before
            no_grace = dataclasses.replace(
                m.config,
                maintenance=dataclasses.replace(m.config.maintenance, orphan_grace_seconds=-60.0),
            )
            run_maintain(no_grace, table="public.t")
            assert all(Path(f).exists() for f in staged)
            conn.execute("INSERT INTO t VALUES (0, 'last')")
        running.wait_flushed(m.insert_lsn())
    finally:
        running.stop()
    m.assert_mirrored("public.t")
    assert not _unreferenced(m, "public.t")
