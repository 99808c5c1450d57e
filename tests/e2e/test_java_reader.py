"""Iceberg's Java runtime reads the mirror's position deletes as pyiceberg does, in both
of its Parquet readers (the vectorized one, Spark's default, and the row reader), by
metadata file and through JdbcCatalog (:mod:`tests.java_reader`); and what the mirror
leaves is the spec's (:mod:`tests.spec_check`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sparkapply.maintain.plan import health
from sparkapply.sink.read import read_table
from tests.java_reader import shared_java_reader, sqlite_catalog_copy
from tests.mirror import Mirror, assert_same_rows
from tests.readers import conform
from tests.spec_check import assert_spec_conformant

pytestmark = pytest.mark.integration


def test_both_java_readers_apply_position_deletes(mirror: Mirror, tmp_path: Path) -> None:
    # No compaction: it would fold the deletes away.
    mirror.config = replace(
        mirror.config, maintenance=replace(mirror.config.maintenance, enabled=False)
    )
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(10,2), at timestamptz)",
        "CREATE PUBLICATION pub FOR TABLE t",
        "INSERT INTO t SELECT g, 'v' || g, g / 3.0, now() FROM generate_series(1, 300) g",
    )
    mirror.run()
    inserted = mirror.iceberg_table("public.t").metadata.current_snapshot_id
    assert inserted is not None
    mirror.sql(
        "UPDATE t SET v = 'changed' WHERE id % 10 = 0",
        "DELETE FROM t WHERE id % 7 = 0",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")  # Java's default (vectorized) reader among them
    table = mirror.iceberg_table("public.t")
    assert health(table).delete_files > 0  # what this test is about
    mine = read_table(table)
    assert mine.num_rows == 300 - 300 // 7
    java = shared_java_reader()
    for vectorized in (True, False):
        # Spark's plan shows which reader: a columnar (vectorized) scan is turned into
        # rows above it; the row reader's scan is not.
        assert ("ColumnarToRow" in java.plan(table, vectorized)) == vectorized
        how = f"java ({'vectorized' if vectorized else 'row reader'})"
        got = conform(java.read(table, vectorized=vectorized), mine.schema, how, "public.t")
        assert_same_rows("public.t", how, got, mine)

    # Through JdbcCatalog on a copy of the SQLite catalog, now and before the deletes.
    jdbc = sqlite_catalog_copy(mirror.jdbc_catalog(), tmp_path / "catalog-copy.db")
    for at, expected in ((None, mine), (inserted, read_table(table, snapshot_id=inserted))):
        for vectorized in (True, False):
            how = f"java (JdbcCatalog, {'vectorized' if vectorized else 'row reader'})"
            got = java.read_catalog(jdbc, "public.t", at, vectorized)
            got = conform(got, expected.schema, how, "public.t")
            assert_same_rows(f"public.t at {at or 'current'}", how, got, expected)
    assert read_table(table, snapshot_id=inserted).num_rows == 300


def _workload(mirror: Mirror) -> list[str]:
    """A table through the changes that write every kind of file and metadata: copy,
    inserts, updates and deletes (position deletes), a column added and one dropped,
    an array column; the tables of the mirror, the cuts table among them."""
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, tags int[], gone int)",
        "INSERT INTO t SELECT g, 'v' || g, ARRAY[g, g + 1], g FROM generate_series(1, 50) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    mirror.sql(
        "UPDATE t SET v = 'changed' WHERE id % 5 = 0",
        "DELETE FROM t WHERE id % 7 = 0",
        "ALTER TABLE t ADD COLUMN added numeric(8,2)",
        "ALTER TABLE t DROP COLUMN gone",
        "INSERT INTO t VALUES (100, 'new', ARRAY[]::int[], 1.5)",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
    return [
        ".".join(ident)
        for ns in mirror.catalog.list_namespaces()
        for ident in mirror.catalog.list_tables(ns)
    ]


def test_every_metadata_file_and_manifest_entry_is_the_specs(mirror: Mirror) -> None:
    tables = _workload(mirror)
    assert {"public.t", "sparkapply.cuts"} <= set(tables)
    for name in tables:
        assert_spec_conformant(mirror.iceberg_table(name), field_ids=False)


def test_every_data_and_delete_file_carries_field_ids(mirror: Mirror) -> None:
    for name in _workload(mirror):
        assert_spec_conformant(mirror.iceberg_table(name), field_ids=True)
