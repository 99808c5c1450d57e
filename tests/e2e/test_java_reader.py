"""Iceberg's Java runtime reads the mirror's position deletes as pyiceberg does, in both
of its Parquet readers (the vectorized one, Spark's default, and the row reader), by
metadata file and through JdbcCatalog (:mod:`tests.java_reader`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sparkapply.maintain.plan import health
from sparkapply.sink.read import read_table
from tests.java_reader import shared_java_reader, sqlite_catalog_copy
from tests.mirror import Mirror, assert_same_rows
from tests.readers import conform

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
