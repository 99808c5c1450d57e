"""Cuts (sink/cuts.py): each batch records the LSN of its last transaction and every
table's snapshot holding exactly the transactions up to it; read together, the tables
are one consistent database. Checked against a workload whose transactions are
numbered and which never changes the total of two tables."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from sparkapply.cli import main
from sparkapply.config import load_config
from sparkapply.errors import CutError
from sparkapply.lsn import Lsn
from sparkapply.maintain.plan import health
from sparkapply.read import cut_snapshots, latest_cut, read_table
from sparkapply.run.exact_cut import wait_for_cut
from sparkapply.run.subscriber import Subscriber
from sparkapply.sink.atomic import atomic_commits
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.cuts import cuts_identifier, read_cuts
from sparkapply.sink.maintenance import expire_and_delete
from tests.conftest import PgServer
from tests.java_reader import shared_java_reader, sqlite_catalog_copy
from tests.mirror import (
    Mirror,
    Running,
    assert_cut_read_alike,
    assert_readers_agree,
    assert_same_rows,
)
from tests.readers import Readers, conform, duckdb_connection

TABLES = ("public.acct_a", "public.acct_b", "public.moves")
TOTAL = 2 * 10 * 100


def _accounts(mirror: Mirror) -> None:
    """Two tables of balances (10 rows of 100 each) and a log of numbered moves."""
    mirror.sql(
        "CREATE TABLE acct_a (id int PRIMARY KEY, bal int)",
        "CREATE TABLE acct_b (id int PRIMARY KEY, bal int)",
        "CREATE TABLE moves (seq int PRIMARY KEY)",
        "INSERT INTO acct_a SELECT g, 100 FROM generate_series(1, 10) g",
        "INSERT INTO acct_b SELECT g, 100 FROM generate_series(1, 10) g",
        "CREATE PUBLICATION pub FOR TABLE acct_a, acct_b, moves",
    )


def _moves(mirror: Mirror, first: int, count: int, rng: random.Random) -> list[Lsn]:
    """``count`` numbered transactions, each moving an amount between a row of acct_a
    and a row of acct_b; the WAL position right after each commit."""
    after = []
    with psycopg.connect(mirror.dsn, autocommit=True) as conn:
        for seq in range(first, first + count):
            amount = rng.randint(-50, 50)
            with conn.transaction():
                conn.execute(
                    "UPDATE acct_a SET bal = bal - %s WHERE id = %s", (amount, rng.randint(1, 10))
                )
                conn.execute(
                    "UPDATE acct_b SET bal = bal + %s WHERE id = %s", (amount, rng.randint(1, 10))
                )
                conn.execute("INSERT INTO moves VALUES (%s)", (seq,))
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            after.append(Lsn(row[0]))
    return after


def test_every_cut_is_one_consistent_database(mirror: Mirror, tmp_path: Path) -> None:
    mirror.config = replace(
        mirror.config,
        apply=replace(mirror.config.apply, batch_max_transactions=3),
        # Without the cuts' protection the apply's own expiry would leave 2 snapshots.
        sink=replace(mirror.config.sink, retain_snapshots=2),
    )
    _accounts(mirror)
    mirror.run()  # the copy
    rng = random.Random(7)
    after: list[Lsn] = []
    for _ in range(4):
        after += _moves(mirror, len(after) + 1, 8, rng)
        mirror.run()
    mirror.assert_mirrored(*TABLES)

    catalog = mirror.catalog
    cuts_table = catalog.load_table(cuts_identifier("sparkapply.cuts"))
    cuts = read_cuts(cuts_table)
    assert len(cuts) >= 4 * 8 // 3, [str(c.lsn) for c in cuts]
    assert cuts[0].committed_at is None and cuts[0].lsn < after[0]  # the copy's cut
    # Java through JdbcCatalog, as users read a cut, on a copy of the SQLite catalog.
    jdbc = sqlite_catalog_copy(mirror.jdbc_catalog(), tmp_path / "catalog-copy.db")
    with Readers() as readers:
        for cut in cuts:
            assert set(cut.tables) == set(TABLES), cut
            # The transactions whose commit LSN is at most the cut's: the cut is the
            # commit LSN of a batch's last transaction k, which lies after transaction
            # k-1 ended (the copy's: none).
            ends = [Lsn(0), *after[:-1]]
            k = sum(1 for end in ends if end < cut.lsn) if cut is not cuts[0] else 0
            read = {t: read_table(catalog.load_table(t), snapshot_id=cut.tables[t]) for t in TABLES}
            seqs = sorted(read["public.moves"].column("seq").to_pylist())
            assert seqs == list(range(1, k + 1)), (str(cut.lsn), seqs)
            total = sum(read["public.acct_a"].column("bal").to_pylist()) + sum(
                read["public.acct_b"].column("bal").to_pylist()
            )
            assert total == TOTAL, (str(cut.lsn), total)
            # Every cut in the readers that read a snapshot; the oldest and newest in Java
            # through the catalog too.
            through = jdbc if cut in (cuts[0], cuts[-1]) else None
            assert_cut_read_alike(mirror, cut.tables, read, readers, through)

    newest = latest_cut(catalog)
    assert newest.lsn == cuts[-1].lsn
    assert newest.tables == {t: catalog.load_table(t).metadata.current_snapshot_id for t in TABLES}
    assert cut_snapshots(catalog, lsn=str(cuts[1].lsn)) == cuts[1].tables
    assert cut_snapshots(catalog, lsn=int(cuts[2].lsn) - 1) == cuts[1].tables
    with Readers() as readers:  # the cuts table itself, in every reader
        assert_readers_agree("sparkapply.cuts", cuts_table, read_table(cuts_table), readers)

    # DuckDB reads a table at a cut's snapshot id, as the README shows.
    old = cuts[0]
    moves = catalog.load_table("public.moves")
    with duckdb_connection() as con:
        (count,) = con.execute(
            "SELECT count(*) FROM iceberg_scan(?, snapshot_from_id => ?)",
            [moves.metadata_location, old.tables["public.moves"]],
        ).fetchone()  # type: ignore[misc]
    assert count == read_table(moves, snapshot_id=old.tables["public.moves"]).num_rows


def test_cut_command(mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE t",
        "INSERT INTO t VALUES (1)",
    )
    mirror.run()
    mirror.sql("INSERT INTO t VALUES (2)")
    mirror.run()
    config = mirror.write_config(tmp_path / "cut.toml")
    capsys.readouterr()
    assert main(["cut", "--config", str(config), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    newest = latest_cut(mirror.catalog)
    assert printed["lsn"] == str(newest.lsn)
    assert printed["tables"] == {
        "public.t": mirror.catalog.load_table("public.t").metadata.current_snapshot_id
    }
    assert printed["committed_at"] is not None and "+00:00" in printed["committed_at"]
    assert printed["iceberg"] == {"public.t": "public.t"}
    location = printed["metadata_locations"]["public.t"]
    assert location == mirror.catalog.load_table("public.t").metadata_location
    with duckdb_connection() as con:  # a reader by path, given nothing else
        (count,) = con.execute(
            "SELECT count(*) FROM iceberg_scan(?, snapshot_from_id => ?)",
            [location, printed["tables"]["public.t"]],
        ).fetchone()  # type: ignore[misc]
    assert count == 2

    assert main(["cut", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert f"cut at LSN {newest.lsn}" in text and "public.t" in text

    assert main(["cut", "--config", str(config), "--lsn", "0/1"]) != 0  # no cut that old
    assert main(["cut", "--config", str(config), "--lsn", "nonsense"]) == 2


def _numbered(mirror: Mirror, first: int, count: int) -> list[Lsn]:
    """Transactions inserting ``first`` … into ``moves``; the WAL position after each."""
    after = []
    with psycopg.connect(mirror.dsn, autocommit=True) as conn:
        for seq in range(first, first + count):
            conn.execute("INSERT INTO moves VALUES (%s)", (seq,))
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            after.append(Lsn(row[0]))
    return after


def _seqs_at(mirror: Mirror, cut_tables: dict[str, int]) -> list[int]:
    """``moves`` at the cut, as pyiceberg reads it, and DuckDB and Java alike."""
    moves = mirror.catalog.load_table("public.moves")
    snapshot_id = cut_tables["public.moves"]
    arrow = read_table(moves, snapshot_id=snapshot_id)
    with Readers() as readers:
        assert_readers_agree("public.moves", moves, arrow, readers, snapshot_id)
    return sorted(arrow.column("seq").to_pylist())


def test_a_requested_cut_lands_exactly_also_when_asked_before_the_run(
    mirror: Mirror, tmp_path: Path
) -> None:
    mirror.sql("CREATE TABLE moves (seq int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE moves")
    mirror.run()
    config = mirror.write_config(tmp_path / "cut.toml")
    after = _numbered(mirror, 1, 10)
    at = after[4]  # transactions 1-5 are at or below it, 6-10 above
    # No run: the request waits under work_dir, and the command gives up, saying why.
    with pytest.raises(CutError, match="not running"):
        wait_for_cut(load_config(config), at, timeout=0.3)
    # The next run splits what would be one batch at the requested LSN.
    mirror.run()
    cut = wait_for_cut(load_config(config), at, timeout=10)
    assert cut.lsn == at and cut.requested
    assert _seqs_at(mirror, cut.tables) == [1, 2, 3, 4, 5]
    mirror.assert_mirrored("public.moves")
    assert not list((mirror.config.work_dir / "cut-requests").iterdir())


def test_a_requested_cut_on_a_live_mirror(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mirror.sql("CREATE TABLE moves (seq int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE moves")
    mirror.run()
    config = mirror.write_config(tmp_path / "cut.toml")
    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    try:
        after = _numbered(mirror, 1, 6)
        running.wait_flushed(after[-1])
        # Idle and caught up: the cut at the server's position now holds everything.
        capsys.readouterr()
        now = _numbered(mirror, 7, 1)[-1]
        assert main(["cut", "--config", str(config), "--at-lsn", str(now), "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["lsn"] == str(now)
        assert _seqs_at(mirror, printed["tables"]) == list(range(1, 8))
        # A position the mirror is past cannot be cut exactly any more.
        assert main(["cut", "--config", str(config), "--at-lsn", str(after[2])]) == 2
    finally:
        running.stop()


def test_a_tagged_cut_survives_expiry_and_reads_by_name(mirror: Mirror, tmp_path: Path) -> None:
    mirror.sql(
        "CREATE TABLE moves (seq int PRIMARY KEY)",
        "CREATE TABLE other (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE moves, other",
    )
    mirror.run()
    _numbered(mirror, 1, 3)
    mirror.sql("INSERT INTO other VALUES (1)")
    mirror.run()
    config = str(mirror.write_config(tmp_path / "cut.toml"))
    tagged = latest_cut(mirror.catalog)
    assert main(["cut", "--config", config, "--tag", "close-2026-11"]) == 0
    assert main(["cut", "--config", config, "--tag", "close-2026-11"]) == 2  # exists
    for _ in range(3):
        _numbered(mirror, len(_seqs_at(mirror, latest_cut(mirror.catalog).tables)) + 1, 2)
        mirror.run()
    # Expire everything expiry may take: the tagged snapshots stay, with their files.
    for name in ("public.moves", "public.other"):
        table = mirror.catalog.load_table(name)
        expire_and_delete(table, older_than=dt.datetime.now(dt.UTC), retain_last=1)
        table = mirror.catalog.load_table(name)
        by_name = table.snapshot_by_name("close-2026-11")
        assert by_name is not None and by_name.snapshot_id == tagged.tables[name]
        kept = {table.metadata.current_snapshot_id, tagged.tables[name]}
        assert {s.snapshot_id for s in table.metadata.snapshots} == kept
    moves = mirror.catalog.load_table("public.moves")
    snapshot_id = tagged.tables["public.moves"]
    assert _seqs_at(mirror, tagged.tables) == [1, 2, 3]  # after expiry, in every reader
    with duckdb_connection() as con:  # DuckDB, at the snapshot the tag names
        rows = con.execute(
            "SELECT seq FROM iceberg_scan(?, snapshot_from_id => ?) ORDER BY seq",
            [moves.metadata_location, snapshot_id],
        ).fetchall()
    assert [r[0] for r in rows] == [1, 2, 3]

    assert main(["cut", "--config", config, "--untag", "close-2026-11"]) == 0
    for name in ("public.moves", "public.other"):
        assert "close-2026-11" not in mirror.catalog.load_table(name).metadata.refs


def test_a_reader_at_the_latest_cut_never_sees_half_a_transaction(mirror: Mirror) -> None:
    """Transfers between two tables, each in one transaction, while the mirror runs
    with maintenance compacting and expiring as often as it can; a reader reads the
    latest cut and both tables at it, from a fresh catalog each pass."""
    mirror.config = replace(
        mirror.config,
        maintenance=replace(
            mirror.config.maintenance,
            max_data_files=2,
            max_delete_files=2,
            retain_snapshots=1,
            retain_seconds=1.0,
        ),
        sink=replace(mirror.config.sink, retain_snapshots=2),
    )
    _accounts(mirror)
    mirror.run()
    stop = threading.Event()
    moved: list[int] = []

    def writer() -> None:
        rng = random.Random(11)
        while not stop.is_set():
            moved.extend(_moves(mirror, len(moved) + 1, 5, rng))
            time.sleep(0.05)

    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    passes, cuts_seen = 0, set()
    try:
        deadline = time.monotonic() + 60  # the issue asks for a minute of reading
        while time.monotonic() < deadline or passes < 20:
            catalog = open_catalog("sparkapply", mirror.config.catalog_properties())
            try:
                cut = latest_cut(catalog)
            except CutError:
                continue  # no batch yet
            tables = {t: catalog.load_table(t) for t in TABLES}
            read = {t: read_table(tables[t], snapshot_id=cut.tables[t]) for t in TABLES}
            total = sum(read["public.acct_a"].column("bal").to_pylist()) + sum(
                read["public.acct_b"].column("bal").to_pylist()
            )
            assert total == TOTAL, (str(cut.lsn), total)
            seqs = sorted(read["public.moves"].column("seq").to_pylist())
            assert seqs == list(range(1, len(seqs) + 1)), str(cut.lsn)
            passes += 1
            cuts_seen.add(cut.lsn)
    finally:
        stop.set()
        thread.join(30)
        running.stop()
    assert len(cuts_seen) > 3, cuts_seen  # the reader saw the mirror move
    mirror.run()
    mirror.assert_mirrored(*TABLES)
    # Maintenance compacted meanwhile: without it each batch left a data file.
    data_files = health(mirror.catalog.load_table("public.acct_a")).data_files
    assert data_files < len(cuts_seen), (data_files, len(cuts_seen))


def test_a_postgresql_catalog_holds_the_mirror_as_one_database(
    mirror: Mirror, pg_server: PgServer, tmp_path: Path
) -> None:
    """The SQL catalog in a PostgreSQL database of its own (as Iceberg's Java
    JdbcCatalog reads it): batches commit atomically there too."""
    name = pg_server.create_database("catalog")
    try:
        uri = pg_server.sqlalchemy_url(name)
        catalog_props = {**mirror.config.sink.catalog, "uri": uri}
        mirror.config = replace(
            mirror.config,
            sink=replace(mirror.config.sink, catalog=catalog_props),
            apply=replace(mirror.config.apply, batch_max_transactions=4),
        )
        _accounts(mirror)
        mirror.run()
        assert atomic_commits(mirror.catalog)
        _moves(mirror, 1, 12, random.Random(3))
        mirror.run()
        mirror.assert_mirrored(*TABLES)
        cut = latest_cut(mirror.catalog)
        for table in TABLES:
            current = mirror.catalog.load_table(table).metadata.current_snapshot_id
            assert cut.tables[table] == current
        # The pointers live in PostgreSQL, where JdbcCatalog finds them.
        with psycopg.connect(pg_server.dsn(name)) as conn:
            rows = conn.execute(
                "SELECT table_namespace, table_name FROM iceberg_tables ORDER BY 1, 2"
            ).fetchall()
        assert ("public", "acct_a") in rows and ("sparkapply", "cuts") in rows
        # And Java finds them: Spark SQL through JdbcCatalog on PostgreSQL, at the cut
        # and at the current snapshot (the catalog's pointer).
        jdbc = mirror.jdbc_catalog()
        assert jdbc.uri.startswith("jdbc:postgresql:"), jdbc.uri
        for table in TABLES:
            mine = read_table(mirror.catalog.load_table(table))
            for at in (cut.tables[table], None):
                got = shared_java_reader().read_catalog(jdbc, table, at)
                got = conform(got, mine.schema, "java (JdbcCatalog)", table)
                assert_same_rows(table, "java (JdbcCatalog)", got, mine)
    finally:
        if mirror.catalog is not None:
            mirror.catalog.engine.dispose()
        pg_server.drop_database(name)
