"""End to end: the initial copy, its hand-over to the stream, tables added later, resync,
and kills in the middle of a copy. Compared row by row with PostgreSQL."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sparkapply.copy.driver as copy_driver
from sparkapply.cli import main as cli_main
from sparkapply.commands.resync import resync
from sparkapply.errors import PublicationError, SlotError
from sparkapply.lsn import Lsn
from sparkapply.read import latest_cut
from sparkapply.run.subscriber import Subscriber
from sparkapply.sink.catalog import open_catalog
from tests.mirror import Mirror, Running, copy_snapshots, normalize, wait_until

pytestmark = pytest.mark.integration


def _assert_equals_query(mirror: Mirror, table: str, query: str) -> None:
    """Iceberg ``table`` holds exactly the rows (and columns) of ``query``."""
    with psycopg.connect(mirror.dsn) as conn:
        cur = conn.execute(query)
        cols = [d.name for d in cur.description or []]
        pg = sorted((tuple(normalize(v) for v in r) for r in cur.fetchall()), key=repr)
    ice_cols, rows = mirror.iceberg_rows(table)
    assert ice_cols == cols, f"{table}: Iceberg columns {ice_cols}, publication {cols}"
    ice = sorted((tuple(normalize(v) for v in r) for r in rows), key=repr)
    assert len(pg) == len(ice), f"{table}: {len(pg)} rows published, {len(ice)} in Iceberg"
    assert pg == ice


def test_existing_rows_are_copied_then_streamed(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(10,2), b bytea, tags text[])",
        "INSERT INTO t SELECT g, 'v' || g || E'\\ttab\\nnl\\\\bs', g / 3.0, "
        "decode(md5(g::text), 'hex'), ARRAY['a', NULL, 'c\"q'] FROM generate_series(1, 5000) g",
        "INSERT INTO t VALUES (0, NULL, NULL, NULL, NULL), (-1, '', 0, '', '{}')",
        "CREATE TABLE empty (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE t, empty",
    )
    mirror.run()
    mirror.assert_mirrored("public.t", "public.empty")
    # One copy snapshot per table, stamped just below the slot's consistent point.
    (copy,) = copy_snapshots(mirror, "public.t")
    assert Lsn.parse(copy["sparkapply.lsn"]) == Lsn.parse(copy["sparkapply.copy-lsn"]) - 1
    assert copy["sparkapply.copy-rows"] == "5002"
    assert len(copy_snapshots(mirror, "public.empty")) == 1
    mirror.sql(
        "UPDATE t SET v = 'changed' WHERE id % 10 = 0",
        "DELETE FROM t WHERE id % 7 = 0",
        "INSERT INTO empty VALUES (1), (2)",
    )
    mirror.run()
    mirror.assert_mirrored("public.t", "public.empty")
    assert len(copy_snapshots(mirror, "public.t")) == 1  # not copied again


@pytest.mark.slow
def test_million_rows_copied_while_the_publisher_writes(
    mirror: Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inserts, updates and deletes from another connection during the whole copy: they
    commit before and after the slot's snapshot, and while the slices are read."""
    rows = 1_000_000
    mirror.sql(
        "CREATE TABLE big (id int PRIMARY KEY, n int)",
        f"INSERT INTO big SELECT g, g FROM generate_series(1, {rows}) g",
        "CREATE PUBLICATION pub FOR TABLE big",
    )
    c = mirror.config
    mirror.catalog = open_catalog(c.sink.catalog_name, c.catalog_properties())
    sub = Subscriber(c, spark=mirror.spark, catalog=mirror.catalog)
    stop_writer = threading.Event()
    commits: list[int] = []
    errors: list[BaseException] = []

    def writer() -> None:
        rng = random.Random(4)
        try:
            with psycopg.connect(mirror.dsn, autocommit=True) as conn:
                i = 0
                while not stop_writer.is_set():
                    i += 1
                    with conn.transaction():
                        conn.execute("INSERT INTO big VALUES (%s, -1)", (rows + i,))
                        conn.execute(
                            "UPDATE big SET n = n + 1 WHERE id IN (%s, %s)",
                            (rng.randint(1, rows), rng.randint(1, rows + i)),
                        )
                        conn.execute("DELETE FROM big WHERE id = %s", (rng.randint(1, rows + i),))
                    commits.append(i)
                    time.sleep(0.005)
        except BaseException as exc:
            errors.append(exc)

    def subscriber() -> None:
        try:
            sub.run()
        except BaseException as exc:
            errors.append(exc)

    def copied() -> bool:
        return sub._copier is not None and bool(sub._copier.reports)

    began = [0]  # commits when the subscriber started

    def copy_lands_after_writes(name: str) -> None:
        # A loaded machine starves the writer while COPY takes both cores: the copy
        # commits only once more than 50 writes landed since the subscriber started
        # (all after the slot's snapshot, before the copy's snapshot lands).
        if name == "copy-before-commit":
            wait_until(lambda: len(commits) - began[0] > 50 or bool(errors), "writes")

    monkeypatch.setattr(copy_driver, "failpoint", copy_lands_after_writes)
    writing = threading.Thread(target=writer)
    streaming = threading.Thread(target=subscriber)
    writing.start()
    try:
        wait_until(lambda: len(commits) > 20 or bool(errors), "the writer to start")
        before = began[0] = len(commits)
        streaming.start()  # creates the slot and copies while the writer runs
        wait_until(lambda: copied() or bool(errors), "the copy")
        during = len(commits) - before
        time.sleep(0.5)  # and a little after the copy committed
        stop_writer.set()
        writing.join()
        target = mirror.insert_lsn()
        wait_until(lambda: sub.summary.flushed >= target or bool(errors), "the stream to catch up")
    finally:
        stop_writer.set()
        sub.stop()
        writing.join()
        if streaming.ident is not None:
            streaming.join()
    assert not errors, errors
    assert during > 50, f"only {during} transactions committed during the copy"
    assert sub._copier is not None
    assert sub._copier.reports[0].rows["public.big"] > rows - 1000
    assert sub.summary.transactions > 50  # transactions after the snapshot were streamed
    mirror.assert_mirrored("public.big")


def test_column_lists_and_row_filters(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, a int, secret text, c text)",
        "INSERT INTO t SELECT g, g % 50, 'hidden' || g, 'c' || g FROM generate_series(1, 3000) g",
        "CREATE TABLE u (a int, b text)",
        "ALTER TABLE u REPLICA IDENTITY FULL",
        "INSERT INTO u SELECT g % 40, 'b' || g FROM generate_series(1, 2000) g",
        "CREATE PUBLICATION pub FOR TABLE t (id, a, c) WHERE (id > 1000), u WHERE (a % 2 = 0)",
    )
    t_query = "SELECT id, a, c FROM t WHERE id > 1000"
    u_query = "SELECT a, b FROM u WHERE a % 2 = 0"
    mirror.run()
    _assert_equals_query(mirror, "public.t", t_query)
    _assert_equals_query(mirror, "public.u", u_query)
    mirror.sql(
        "INSERT INTO t VALUES (-5, 1, 's', 'below'), (5005, 2, 's', 'above')",
        "UPDATE t SET id = id + 10000 WHERE id BETWEEN 1 AND 10",  # moves rows into the filter
        "UPDATE t SET c = 'changed', secret = 'x' WHERE id % 3 = 0",
        "DELETE FROM t WHERE id % 11 = 0",
        "UPDATE u SET a = a + 1 WHERE b LIKE 'b1%'",  # in and out of the filter
        "DELETE FROM u WHERE b LIKE 'b2%'",
    )
    mirror.run()
    _assert_equals_query(mirror, "public.t", t_query)
    _assert_equals_query(mirror, "public.u", u_query)


def test_tables_added_to_the_publication_are_copied_while_streaming(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, v text)",
        "CREATE TABLE c (id int PRIMARY KEY, v text)",
        "INSERT INTO b SELECT g, 'b' || g FROM generate_series(1, 3000) g",
        "INSERT INTO c SELECT g, 'c' || g FROM generate_series(1, 2000) g",
        "CREATE PUBLICATION pub FOR TABLE a",
    )
    c = mirror.config
    mirror.catalog = open_catalog(c.sink.catalog_name, c.catalog_properties())
    sub = Subscriber(c, spark=mirror.spark, catalog=mirror.catalog)
    sub.publication_check_interval = 3600.0  # b must be found by its first change
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sub.run()
        except BaseException as exc:
            errors.append(exc)

    def copied(table: str) -> bool:
        copier = sub._copier
        return copier is not None and any(table in r.rows for r in copier.reports)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: sub._copier is not None or bool(errors), "the slot and the first copy")
        mirror.sql("INSERT INTO a VALUES (1, 'streamed')")
        wait_until(lambda: sub.summary.transactions >= 1 or bool(errors), "streaming to start")
        # b: published, then changed. Its first RELATION message triggers the copy;
        # the changes made before the copy's snapshot must not be applied twice.
        mirror.sql(
            "ALTER PUBLICATION pub ADD TABLE b",
            "UPDATE b SET v = 'u' WHERE id % 3 = 0",
            "DELETE FROM b WHERE id % 5 = 0",
            "INSERT INTO b VALUES (100000, 'new')",
        )
        wait_until(lambda: copied("public.b") or bool(errors), "the copy of b")
        mirror.sql("UPDATE b SET v = 'after copy' WHERE id < 100", "INSERT INTO a VALUES (2, 'x')")
        # c: published and idle: the periodic check finds it.
        mirror.sql("ALTER PUBLICATION pub ADD TABLE c")
        assert sub._copier is not None
        sub._copier.check_interval = 0.5
        wait_until(lambda: copied("public.c") or bool(errors), "the copy of c")
        mirror.sql("DELETE FROM c WHERE id <= 10", "UPDATE c SET v = 'streamed' WHERE id = 20")
        target = mirror.insert_lsn()
        wait_until(lambda: sub.summary.flushed >= target or bool(errors), "the stream to catch up")
    finally:
        sub.stop()
        thread.join()
    assert not errors, errors
    mirror.assert_mirrored("public.a", "public.b", "public.c")
    assert len(copy_snapshots(mirror, "public.b")) == 1
    assert len(copy_snapshots(mirror, "public.c")) == 1


def test_a_table_that_left_the_publication_is_copied_when_it_comes_back(
    mirror: Mirror,
) -> None:
    """Changes made while a table is out of the publication are never streamed. The
    periodic check that finds it gone marks it, and published again it is copied again
    (before, the mirror kept its old rows until a resync). A table renamed and renamed
    back is the same case: its old name left the publication meanwhile."""
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE r (id int PRIMARY KEY, v text)",
        "CREATE TABLE other (id int PRIMARY KEY)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g",
        "INSERT INTO r SELECT g, 'r' || g FROM generate_series(1, 100) g",
        "CREATE PUBLICATION pub FOR TABLE t, r, other",
    )
    mirror.run()
    sub = Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog)
    sub.publication_check_interval = 0.5

    def marked(table: str) -> bool:
        return "sparkapply.copy-again" in mirror.catalog.load_table(("public", table)).properties

    running = Running(sub)
    try:
        mirror.sql("INSERT INTO other VALUES (1)")
        wait_until(lambda: sub.summary.transactions >= 1 or bool(running.errors), "streaming")
        mirror.sql("ALTER PUBLICATION pub DROP TABLE t", "ALTER TABLE r RENAME TO r2")
        wait_until(
            lambda: (marked("t") and marked("r")) or bool(running.errors), "t and r to leave"
        )
        mirror.sql(
            "DELETE FROM t WHERE id <= 100",
            "UPDATE t SET v = 'unpublished' WHERE id % 2 = 0",
            "UPDATE r2 SET v = 'renamed' WHERE id % 3 = 0",
            "ALTER PUBLICATION pub ADD TABLE t",
            "ALTER TABLE r2 RENAME TO r",
            "INSERT INTO t VALUES (9999, 'published again')",
            "UPDATE r SET v = 'back' WHERE id <= 10",
            "INSERT INTO other VALUES (2)",
        )
        running.wait_flushed(mirror.insert_lsn())
        wait_until(
            lambda: not (marked("t") or marked("r")) or bool(running.errors), "copies of t, r"
        )
    finally:
        running.stop()
    mirror.assert_mirrored("public.t", "public.r", "public.other")
    assert len(copy_snapshots(mirror, "public.t")) == 2


def test_resync_replaces_a_table_that_drifted(mirror: Mirror, tmp_path: Path) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE other (id int PRIMARY KEY)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 2000) g",
        "CREATE PUBLICATION pub FOR TABLE t, other",
    )
    mirror.run()
    # Changes made while the table is out of the publication are never streamed:
    # the mirror drifts, and only a resync can repair it.
    mirror.sql(
        "ALTER PUBLICATION pub DROP TABLE t",
        "DELETE FROM t WHERE id <= 500",
        "UPDATE t SET v = 'unpublished' WHERE id % 2 = 0",
        "ALTER PUBLICATION pub ADD TABLE t",
        "INSERT INTO t VALUES (9999, 'published again')",
    )
    mirror.run()
    with pytest.raises(AssertionError):
        mirror.assert_mirrored("public.t")

    report = resync(mirror.config, "public.t", spark=mirror.spark, catalog=mirror.catalog)
    assert report.rows == {"public.t": 1501}
    mirror.assert_mirrored("public.t", "public.other")
    mirror.sql("UPDATE t SET v = 'after resync' WHERE id > 1900", "DELETE FROM t WHERE id = 9999")
    mirror.run()
    mirror.assert_mirrored("public.t")

    with pytest.raises(PublicationError, match=r"public\.nope is not published"):
        resync(mirror.config, "public.nope", spark=mirror.spark, catalog=mirror.catalog)


def test_resync_command_and_its_refusals(mirror: Mirror, tmp_path: Path) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    cfg = mirror.write_config(tmp_path / "resync.toml")
    assert cli_main(["resync", "--config", str(cfg), "--table", "t"]) == 2  # not schema.table
    assert cli_main(["resync", "--config", str(cfg), "--table", "public.missing"]) == 2
    assert cli_main(["resync", "--config", str(cfg), "--table", "public.t"]) == 0
    assert len(copy_snapshots(mirror, "public.t")) == 2
    mirror.assert_mirrored("public.t")
    # Refused while the slot is in use (a running subscriber).
    with _slot_in_use(mirror), pytest.raises(SlotError, match="in use"):
        resync(mirror.config, "public.t", spark=mirror.spark, catalog=mirror.catalog)


class _slot_in_use:
    """Holds the subscriber's slot active, as a running subscriber does."""

    def __init__(self, mirror: Mirror) -> None:
        from sparkapply.source.connection import ReplicationConnection
        from sparkapply.source.negotiation import negotiate, start_replication_command

        self._conn = ReplicationConnection(mirror.dsn)
        protocol = negotiate(self._conn.server_version)
        self._conn.start_copy_both(
            start_replication_command(mirror.slot, Lsn(0), ["pub"], protocol)
        )

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        self._conn.close()


# -- kills in the middle of the copy -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("failpoint", "atomic"),
    [
        ("copy-progress", True),  # slices are being read: nothing committed, slot recreated
        ("copy-before-commit", True),  # every slice written, nothing committed
        # One catalog transaction: every table committed, with the copy's cut.
        ("copy-after-table-commit", True),
        # Table by table: one table committed, the others from a new snapshot.
        ("copy-after-table-commit", False),
        ("copy-after-table-commit:2", False),
    ],
)
def test_kill_during_the_copy_and_restart(
    mirror: Mirror, tmp_path: Path, failpoint: str, atomic: bool
) -> None:
    rows_a = 400_000 if failpoint == "copy-progress" else 20_000
    mirror.sql(
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, n int)",
        "CREATE TABLE c (id int PRIMARY KEY, n int)",
        # For copy-progress a takes seconds to read, so the progress poll sees it running.
        f"INSERT INTO a SELECT g, repeat('x', 200) || g FROM generate_series(1, {rows_a}) g",
        "INSERT INTO b SELECT g, g FROM generate_series(1, 5000) g",
        "CREATE PUBLICATION pub FOR TABLE a, b, c",
    )
    mirror.run_killed(failpoint, tmp_path, atomic_commit=atomic)
    if atomic and failpoint == "copy-after-table-commit":  # the copy and its cut landed
        catalog = open_catalog("sparkapply", mirror.config.catalog_properties())
        cut = latest_cut(catalog)
        assert sorted(cut.tables) == ["public.a", "public.b", "public.c"]
        for name, snapshot_id in cut.tables.items():
            assert catalog.load_table(name).metadata.current_snapshot_id == snapshot_id
    # Changes between the kill and the restart: after the first snapshot, possibly
    # before a new one.
    mirror.sql(
        "UPDATE a SET v = 'after kill' WHERE id % 1000 = 0",
        "DELETE FROM a WHERE id % 997 = 0",
        "INSERT INTO b SELECT g, -g FROM generate_series(5001, 5100) g",
        "UPDATE b SET n = 0 WHERE id <= 100",
        "INSERT INTO c VALUES (1, 1), (2, 2)",
    )
    mirror.run()
    mirror.assert_mirrored("public.a", "public.b", "public.c")
    mirror.sql("DELETE FROM b WHERE id > 5000", "UPDATE c SET n = 10")
    mirror.run()
    mirror.assert_mirrored("public.a", "public.b", "public.c")
    points = {}
    for table in ("public.a", "public.b", "public.c"):
        (copy,) = copy_snapshots(mirror, table)  # each table copied exactly once
        points[table] = Lsn.parse(copy["sparkapply.copy-lsn"])
    committed_before_kill = {
        "copy-after-table-commit": ["public.a"],
        "copy-after-table-commit:2": ["public.a", "public.b"],
    }.get(failpoint, [])
    if atomic and committed_before_kill:
        assert len(set(points.values())) == 1  # all of them, at the slot's snapshot
        return
    # Nothing committed: the slot was created again, one snapshot for all. Otherwise the
    # tables committed before the kill keep the slot's snapshot, and the rest share the
    # later snapshot of a temporary slot.
    later = [t for t in points if t not in committed_before_kill]
    assert len({points[t] for t in later}) == 1
    for t in committed_before_kill:
        assert points[t] < points[later[0]]
