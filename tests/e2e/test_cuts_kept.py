"""Cuts made and kept as promised (sink/cuts.py, copy/commit.py): a copy is a cut;
expiry, the run's and ``sparkapply maintain``'s, keeps what the newest cut, the kept
cuts and the tags name; old metadata files go by Iceberg's table properties, and
every retained snapshot and kept cut still reads, in pyiceberg and in DuckDB."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pytest

from sparkapply.cli import main
from sparkapply.lsn import Lsn
from sparkapply.read import latest_cut, read_table
from sparkapply.sink.cuts import cuts_identifier, kept_cuts
from sparkapply.sink.maintenance import list_files
from tests.mirror import Mirror, copy_snapshots
from tests.readers import duckdb_connection

Rows = list[tuple[Any, ...]]


def _pyiceberg_rows(mirror: Mirror, table: str, snapshot_id: int) -> Rows:
    arrow = read_table(mirror.iceberg_table(table), snapshot_id=snapshot_id)
    return sorted(tuple(r.values()) for r in arrow.to_pylist())


def _duckdb_rows(
    con: duckdb.DuckDBPyConnection, mirror: Mirror, table: str, snapshot_id: int
) -> Rows:
    location = mirror.iceberg_table(table).metadata_location
    got = con.execute(
        "SELECT * FROM iceberg_scan(?, snapshot_from_id => ?)", [location, snapshot_id]
    ).fetchall()
    return sorted(tuple(r) for r in got)


def _publisher(mirror: Mirror, *tables: str) -> dict[str, Rows]:
    return {t: sorted(mirror.pg_rows(t)[1]) for t in tables}


def _assert_cut_reads(mirror: Mirror, tables: dict[str, int], expected: dict[str, Rows]) -> None:
    """Each table at the cut's snapshot holds ``expected``, in pyiceberg and DuckDB."""
    assert set(tables) == set(expected), (sorted(tables), sorted(expected))
    with duckdb_connection() as con:
        for table, snapshot_id in tables.items():
            assert _pyiceberg_rows(mirror, table, snapshot_id) == expected[table], table
            assert _duckdb_rows(con, mirror, table, snapshot_id) == expected[table], table


def _copy_lsn(mirror: Mirror, table: str) -> Lsn:
    """The point of the table's latest copy (its snapshot's ``sparkapply.copy-lsn``)."""
    return Lsn.parse(copy_snapshots(mirror, table)[-1]["sparkapply.copy-lsn"])


def test_every_copy_is_a_cut(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mirror.sql(
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, n int)",
        "CREATE TABLE e (id int PRIMARY KEY)",  # empty: copied all the same
        "INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 40) g",
        "INSERT INTO b SELECT g, g * 7 FROM generate_series(1, 15) g",
        "CREATE PUBLICATION pub FOR TABLE a, b, e",
    )
    mirror.run()  # the copy, and nothing after it on the publisher
    config = str(mirror.write_config(tmp_path / "cut.toml"))
    capsys.readouterr()
    assert main(["cut", "--config", config, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    tables = ("public.a", "public.b", "public.e")
    assert Lsn.parse(printed["lsn"]) == _copy_lsn(mirror, "public.a") - 1
    for table in tables:  # each table at its copy's snapshot, the one it has
        assert len(copy_snapshots(mirror, table)) == 1
        assert printed["tables"][table] == mirror.iceberg_table(table).metadata.current_snapshot_id
    _assert_cut_reads(mirror, printed["tables"], _publisher(mirror, *tables))

    # A table added to the publication is copied from a snapshot of its own, past the
    # stream: its cut is recorded once the stream is there, the publisher idle.
    mirror.sql(
        "CREATE TABLE late (id int PRIMARY KEY, v text)",
        "INSERT INTO late SELECT g, 'late' || g FROM generate_series(1, 9) g",
        "ALTER PUBLICATION pub ADD TABLE late",
    )
    mirror.run()
    cut = latest_cut(mirror.catalog)
    assert cut.lsn == _copy_lsn(mirror, "public.late") - 1
    everything = (*tables, "public.late")
    _assert_cut_reads(mirror, cut.tables, _publisher(mirror, *everything))

    # A resync (the mirror stopped): the next run records the cut at its point.
    mirror.sql("UPDATE b SET n = -n WHERE id <= 3")
    mirror.run()
    assert main(["resync", "--config", config, "--table", "public.a"]) == 0
    assert latest_cut(mirror.catalog).lsn < _copy_lsn(mirror, "public.a") - 1
    mirror.run()
    cut = latest_cut(mirror.catalog)
    assert cut.lsn == _copy_lsn(mirror, "public.a") - 1
    _assert_cut_reads(mirror, cut.tables, _publisher(mirror, *everything))


def _assert_both_read(mirror: Mirror, tables: dict[str, int]) -> None:
    """Each table at its snapshot reads, and the same, in pyiceberg and DuckDB."""
    with duckdb_connection() as con:
        for table, snapshot_id in tables.items():
            mine = _pyiceberg_rows(mirror, table, snapshot_id)
            assert _duckdb_rows(con, mirror, table, snapshot_id) == mine, (table, snapshot_id)


def _updates(mirror: Mirror, count: int, start: int) -> None:
    """``count`` transactions, each updating one row of the busy table."""
    for i in range(start, start + count):
        mirror.sql(f"UPDATE busy SET n = n + {i} WHERE id = {i % 10 + 1}")


def _metadata_files(mirror: Mirror, table: str) -> int:
    location = mirror.iceberg_table(table).location()
    return sum(1 for p, _, _ in list_files(location) if p.endswith(".metadata.json"))


def test_expiry_keeps_the_newest_cut_and_the_tagged_ones(mirror: Mirror, tmp_path: Path) -> None:
    """A busy table beside a quiet one, maintenance as eager as it gets (1 s,
    one snapshot): beside the apply, then ``sparkapply maintain`` after the newest cut
    is older than retain_seconds. The newest cut, every kept cut and the tagged one
    read; old metadata files are gone to the count each table keeps."""
    maintenance = {"retain_seconds": 1, "retain_snapshots": 1, "max_data_files": 2}
    mirror.config = replace(
        mirror.config,
        apply=replace(mirror.config.apply, batch_max_transactions=1),
        sink=replace(mirror.config.sink, retain_snapshots=2),
        maintenance=replace(mirror.config.maintenance, **maintenance),  # type: ignore[arg-type]
    )
    mirror.sql(
        "CREATE TABLE busy (id int PRIMARY KEY, n int)",
        "CREATE TABLE quiet (id int PRIMARY KEY, v text)",
        "INSERT INTO busy SELECT g, 0 FROM generate_series(1, 10) g",
        "INSERT INTO quiet SELECT g, 'q' || g FROM generate_series(1, 5) g",
        "CREATE PUBLICATION pub FOR TABLE busy, quiet",
    )
    tables = ("public.busy", "public.quiet")
    mirror.run()
    busy = mirror.iceberg_table("public.busy")
    with busy.transaction() as txn:  # a user's own count: respected
        txn.set_properties({"write.metadata.previous-versions-max": "3"})
    config = mirror.write_config(tmp_path / "cut.toml")
    with config.open("a") as f:
        f.write("[maintenance]\n" + "".join(f"{k} = {v}\n" for k, v in maintenance.items()))

    _updates(mirror, 6, 0)
    mirror.run()  # maintenance beside the apply compacts and expires as it goes
    assert main(["cut", "--config", str(config), "--tag", "t1"]) == 0
    tagged = latest_cut(mirror.catalog)
    tagged_rows = _publisher(mirror, *tables)
    _updates(mirror, 6, 6)
    mirror.run()
    _assert_cut_reads(mirror, latest_cut(mirror.catalog).tables, _publisher(mirror, *tables))

    # The newest cut at the table's current snapshot, then maintain's compaction moves
    # the table on: what the cut names is then a snapshot expiry would take.
    mirror.config = replace(
        mirror.config, maintenance=replace(mirror.config.maintenance, enabled=False)
    )
    _updates(mirror, 2, 12)
    mirror.run()
    newest = latest_cut(mirror.catalog)
    newest_rows = _publisher(mirror, *tables)
    time.sleep(1.5)  # every cut is older than retain_seconds now
    assert main(["maintain", "--config", str(config)]) == 0

    busy = mirror.iceberg_table("public.busy")
    assert busy.metadata.current_snapshot_id != newest.tables["public.busy"]  # compacted
    kept = {newest.tables["public.busy"], tagged.tables["public.busy"]}
    assert kept <= {s.snapshot_id for s in busy.metadata.snapshots}
    _assert_cut_reads(mirror, newest.tables, newest_rows)
    for table in tables:  # the tag names the tagged cut's snapshots
        by_name = mirror.iceberg_table(table).snapshot_by_name("t1")
        assert by_name is not None and by_name.snapshot_id == tagged.tables[table]
    _assert_cut_reads(mirror, tagged.tables, tagged_rows)
    cuts_table = mirror.catalog.load_table(cuts_identifier("sparkapply.cuts"))
    for cut in kept_cuts(cuts_table, 1.0):
        _assert_both_read(mirror, cut.tables)
    for table in tables:  # every retained snapshot, too
        for snapshot in mirror.iceberg_table(table).metadata.snapshots:
            _assert_both_read(mirror, {table: snapshot.snapshot_id})

    # Old metadata files: the user's 3 on busy (and the current one); sparkapply's
    # default of 20 elsewhere.
    assert _metadata_files(mirror, "public.busy") == 4
    assert len(busy.metadata.metadata_log) == 3
    for table in ("public.quiet", "sparkapply.cuts"):
        assert _metadata_files(mirror, table) <= 21
        props = mirror.iceberg_table(table).properties
        assert props["write.metadata.previous-versions-max"] == "20"
