"""End to end: every file sparkapply writes carries the table schema's field ids.

The copy, the apply (data and position-delete files), staging, compaction and the cuts
table each write Parquet; every file of every snapshot must hold the field ids of the
schema it was written in, list elements included, and delete files the spec's
reserved ids (tests/field_ids.py). With ids, every reader resolves columns without the
name mapping, iceberg-rust's list columns included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import psycopg
import pytest
from pyiceberg.manifest import DataFileContent

from sparkapply.maintain.command import run_maintain
from tests.conftest import PgServer
from tests.field_ids import assert_field_ids, table_files
from tests.mirror import Mirror
from tests.readers import unreadable

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
