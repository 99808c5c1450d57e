"""End to end: every file sparkapply writes carries the table schema's field ids.

The copy, the apply (data and position-delete files), staging, compaction and the cuts
table each write Parquet; every file of every snapshot must hold the field ids of the
schema it was written in, list elements included, and delete files the spec's
reserved ids (tests/field_ids.py). With ids, every reader resolves columns without the
name mapping, iceberg-rust's list columns included.

And what the ids make possible: a column Iceberg cannot retype (a type change it
cannot widen, a column dropped and added again with another type) is replaced by a
new field while the run goes on, and the snapshots before keep reading the old one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyiceberg.manifest import DataFileContent

from sparkapply.maintain.command import run_maintain
from sparkapply.sink.read import read_table
from tests.conftest import PgServer
from tests.field_ids import assert_field_ids, pinned, table_files
from tests.mirror import Mirror, assert_readers_agree, reader_rows
from tests.readers import Readers, conform, duckdb_connection, unreadable

pytestmark = pytest.mark.integration


@pytest.fixture()
def staging(mirror: Mirror, pg_server: PgServer) -> Iterator[Mirror]:
    """Streamed transactions staged in small pieces (as in test_staging.py)."""
    pg_server.set_streaming("immediate")
    cfg = mirror.config
    mirror.config = dataclasses.replace(
        cfg, apply=dataclasses.replace(cfg.apply, stage_bytes=64 * 1024)
    )
    yield mirror
    pg_server.set_streaming("buffered")


def test_every_written_file_carries_the_schemas_field_ids(staging: Mirror) -> None:
    m = staging
    m.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, a int[], ts timestamptz[])",
        "CREATE PUBLICATION pub FOR TABLE t",
        "INSERT INTO t SELECT g, 'copied', ARRAY[g, NULL], ARRAY['2024-01-01'::timestamptz] "
        "FROM generate_series(1, 300) g",
    )
    m.run()  # the copy
    with psycopg.connect(m.dsn) as conn:  # one streamed transaction: staged
        conn.execute(
            "INSERT INTO t SELECT g, repeat('x', g % 50), ARRAY[g], NULL "
            "FROM generate_series(1001, 4000) g"
        )
    assert m.run().staged_rows > 1000
    m.sql(
        "UPDATE t SET v = 'updated', a = ARRAY[1, 2, 3] WHERE id % 10 = 0",
        "DELETE FROM t WHERE id % 7 = 0",
    )
    m.run()  # the apply
    # A list column added, and a list's element widened: the ids of the new schema.
    m.sql(
        "ALTER TABLE t ADD COLUMN b text[]",
        "ALTER TABLE t ALTER COLUMN a TYPE bigint[]",
        "INSERT INTO t VALUES (5000, 'late', ARRAY[2^40], NULL, ARRAY['b', NULL])",
        "UPDATE t SET b = ARRAY['x'] WHERE id = 1",
    )
    m.run()
    # b is missing from the older files, which iceberg-rust cannot fill (readers.py).
    assert unreadable("iceberg-rust", m.iceberg_table("public.t")) == ["b"]
    m.assert_mirrored("public.t")
    eager = dataclasses.replace(
        m.config, maintenance=dataclasses.replace(m.config.maintenance, max_data_files=1)
    )
    run_maintain(eager, table="public.t")  # compaction

    table = m.iceberg_table("public.t")
    counts = assert_field_ids(table)
    assert counts[DataFileContent.DATA] >= 5 and counts[DataFileContent.POSITION_DELETES] >= 1
    names = [path.rsplit("/", 1)[-1] for path, _, _ in table_files(table)]
    for writer in ("sparkapply-copy-", "sparkapply-staged-", "-compacted", "-deletes"):
        assert any(writer in n for n in names), f"no file of {writer!r} in {names}"
    assert len(table.metadata.schemas) == 2  # both schemas' files were checked
    assert assert_field_ids(m.iceberg_table("sparkapply.cuts"))[DataFileContent.DATA] >= 1
    # Every reader, iceberg-rust's list columns included, reads the publisher's rows.
    assert unreadable("iceberg-rust", table) == []
    m.assert_mirrored("public.t")


# Each table's column v (c for drc, the empty e) and what the DDL makes of it; w in
# "it" is widened, which stays a widening (the same field).
RETYPED = {
    "drc": (
        "c int",
        "ALTER TABLE drc DROP COLUMN c; ALTER TABLE drc ADD COLUMN c text",
        "'new'",
    ),
    "e": ("c int", "ALTER TABLE e DROP COLUMN c; ALTER TABLE e ADD COLUMN c text", "'new'"),
    "ti": ("v text", "ALTER TABLE ti ALTER COLUMN v TYPE int USING v::int", "70"),
    "it": ("v int, w int", "ALTER TABLE it ALTER COLUMN v TYPE text, ALTER w TYPE bigint", "'7!'"),
    "tz": (
        "v timestamp",
        "ALTER TABLE tz ALTER COLUMN v TYPE timestamptz",
        "'2024-02-01 12:00+02'",
    ),
    "zt": ("v timestamptz", "ALTER TABLE zt ALTER COLUMN v TYPE timestamp", "'2024-02-01 12:00'"),
    "nu": ("v numeric(10,2)", "ALTER TABLE nu ALTER COLUMN v TYPE int", "7"),
}
FIRST = {
    "drc": "g",
    "e": "g",
    "ti": "g::text",
    "it": "g, g",
    "tz": "'2024-01-01'::timestamp + g * interval '1 hour'",
    "zt": "'2024-01-01 00:00+00'::timestamptz + g * interval '1 hour'",
    "nu": "g + 0.25",
}


def test_a_column_iceberg_cannot_retype_is_replaced_without_a_stop(
    mirror: Mirror, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = mirror
    names = [f"public.{t}" for t in RETYPED]
    m.sql(
        *(f"CREATE TABLE {t} (id int PRIMARY KEY, {cols})" for t, (cols, _, _) in RETYPED.items()),
        "CREATE PUBLICATION pub FOR ALL TABLES",
        *(
            f"INSERT INTO {t} SELECT g, {FIRST[t]} FROM generate_series(1, 5) g"
            for t in RETYPED
            if t != "e"
        ),
    )
    m.run()  # the copy
    m.sql(*(f"UPDATE {t} SET id = 10 WHERE id = 5" for t in RETYPED))
    m.run()
    before = {n: m.iceberg_table(n) for n in names}
    old_rows = {n: read_table(t) for n, t in before.items()}
    old_ids = {n: {f.name: f.field_id for f in t.schema().fields} for n, t in before.items()}

    # Changes before the DDL, the DDL, and changes after it, in one run.
    m.sql(
        *(f"DELETE FROM {t} WHERE id = 1" for t in RETYPED),
        *(ddl for _, ddl, _ in RETYPED.values()),
        *(
            f"INSERT INTO {t} (id, {_column(t)}) VALUES (7, {v})"
            for t, (_, _, v) in RETYPED.items()
        ),
        *(f"UPDATE {t} SET {_column(t)} = {v} WHERE id = 2" for t, (_, _, v) in RETYPED.items()),
    )
    with caplog.at_level(logging.INFO):
        m.run()  # no stop
    m.assert_mirrored(*names)
    log = caplog.text
    assert "copying the table again" in log and "replaced column(s)" in log

    for name, old in before.items():
        table = m.iceberg_table(name)
        ids = {f.name: f.field_id for f in table.schema().fields}
        column = _column(name.split(".")[1])
        assert list(ids) == list(old_ids[name]), f"{name}: columns moved: {list(ids)}"
        assert ids[column] > max(old_ids[name].values()), f"{name}.{column} not replaced"
        assert ids["id"] == old_ids[name]["id"]
        # The snapshot from before the change reads its old values, in every reader.
        snapshot_id = old.metadata.current_snapshot_id
        assert snapshot_id is not None
        then = read_table(table, snapshot_id=snapshot_id)
        assert then.equals(old_rows[name]), f"{name} at {snapshot_id}: {then.to_pylist()}"
        # DuckDB's own time travel; then every reader on a metadata file whose current
        # snapshot it is (iceberg-rust takes no snapshot id).
        with duckdb_connection() as con:
            duck = con.execute(
                "SELECT * FROM iceberg_scan(?, snapshot_from_id => ?)",
                [table.metadata_location, snapshot_id],
            ).to_arrow_table()
        duck = conform(duck, old_rows[name].schema, "duckdb", name)
        assert reader_rows(duck) == reader_rows(old_rows[name]), f"duckdb {name}@{snapshot_id}"
        at = pinned(table, snapshot_id, tmp_path)
        with Readers() as readers:
            assert_readers_agree(f"{name}@{snapshot_id}", at, read_table(at), readers)
        assert read_table(at).equals(old_rows[name])
    widened = m.iceberg_table("public.it").schema().find_field("w")
    assert widened.field_id == old_ids["public.it"]["w"] and str(widened.field_type) == "long"

    # The stream goes on into the new columns.
    m.sql(*(f"UPDATE {t} SET {_column(t)} = NULL WHERE id = 3" for t in RETYPED))
    m.run()
    m.assert_mirrored(*names)
    for name in names:
        assert_field_ids(m.iceberg_table(name))

    # Killed after the column was replaced, before the copy committed: the intent was
    # recorded first, so the next start copies the table (else its rows kept nulls).
    m.sql("ALTER TABLE nu ALTER COLUMN v TYPE text", "INSERT INTO nu VALUES (8, 'eight')")
    m.run_killed("copy-before-commit", tmp_path)
    nu = m.catalog.load_table(("public", "nu"))
    assert str(nu.schema().find_field("v").field_type) == "string", "killed before the replace"
    assert "int to string" in nu.properties["sparkapply.copy-again"]
    m.run()
    m.assert_mirrored("public.nu")
    assert "sparkapply.copy-again" not in m.catalog.load_table(("public", "nu")).properties


def _column(table: str) -> str:
    return "c" if table in ("drc", "e") else "v"
