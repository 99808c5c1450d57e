"""The field ids in a table's Parquet files, against the table's schemas.

Every data and delete file sparkapply writes carries Parquet field ids: a data file
those of the schema it was written in (list elements included), a position-delete file
the reserved ids of its two columns (Iceberg spec). :func:`assert_field_ids` checks it
for every file of every snapshot a table still has.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFileContent
from pyiceberg.schema import Schema
from pyiceberg.table import StaticTable, Table
from pyiceberg.types import IcebergType, ListType, NestedField

from sparkapply.datafiles import FILE_PATH_FIELD_ID, POS_FIELD_ID
from sparkapply.storage import filesystem

Ids = dict[tuple[str, ...], int | None]
"""Field path (a list's element as ``"element"``) → its field id (None: none)."""

POSITION_DELETE_IDS: Ids = {("file_path",): FILE_PATH_FIELD_ID, ("pos",): POS_FIELD_ID}


def file_ids(uri: str) -> Ids:
    """The field ids of a Parquet file, as its schema holds them."""
    fs, path = filesystem(uri)
    with fs.open_input_file(path) as stream:
        schema = pq.ParquetFile(stream).schema_arrow
    out: Ids = {}
    for field in schema:
        _arrow_ids(field, (), out)
    return out


def _arrow_ids(field: pa.Field, parent: tuple[str, ...], out: Ids) -> None:
    path = (*parent, field.name)
    raw = (field.metadata or {}).get(b"PARQUET:field_id")
    out[path] = int(raw) if raw is not None else None
    if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
        _arrow_ids(field.type.value_field.with_name("element"), path, out)


def schema_ids(schema: Schema) -> Ids:
    """The field ids of an Iceberg schema, by the paths a Parquet file names them."""
    out: Ids = {}
    for field in schema.fields:
        _iceberg_ids(field.name, field.field_id, field.field_type, (), out)
    return out


def _iceberg_ids(
    name: str, field_id: int, field_type: IcebergType, parent: tuple[str, ...], out: Ids
) -> None:
    path = (*parent, name)
    out[path] = field_id
    if isinstance(field_type, ListType):
        element: NestedField = field_type.element_field
        _iceberg_ids("element", element.field_id, element.field_type, path, out)


def table_files(table: Table) -> Iterator[tuple[str, DataFileContent, int]]:
    """``(path, content, schema id)`` of every file of every snapshot the table has;
    the schema id is that of the snapshot that added the file."""
    metadata = table.metadata
    seen: set[str] = set()
    for snapshot in metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io):
                f = entry.data_file
                if f.file_path in seen:
                    continue
                seen.add(f.file_path)
                added_by = metadata.snapshot_by_id(entry.snapshot_id or snapshot.snapshot_id)
                schema_id = (added_by or snapshot).schema_id
                if schema_id is None:
                    schema_id = metadata.current_schema_id
                yield f.file_path, f.content, schema_id


def live_data_files(table: Table) -> list[str]:
    """The data files of the table's current snapshot."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    return [
        entry.data_file.file_path
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io)
        if entry.data_file.content == DataFileContent.DATA
    ]


def assert_field_ids(table: Table) -> dict[DataFileContent, int]:
    """Every file of ``table`` carries the field ids of its schema (delete files the
    reserved ones); how many files of each content were checked."""
    schemas = {s.schema_id: s for s in table.metadata.schemas}
    counts: dict[DataFileContent, int] = {}
    for path, content, schema_id in table_files(table):
        got = file_ids(path)
        if content == DataFileContent.DATA:
            want = schema_ids(schemas[schema_id])
        else:
            want = POSITION_DELETE_IDS
        assert got == want, f"{'.'.join(table.name())}: {path} has ids {got}, not {want}"
        counts[content] = counts.get(content, 0) + 1
    return counts


def pinned(table: Table, snapshot_id: int, where: Path) -> StaticTable:
    """``table`` as of ``snapshot_id``, as a table whose current snapshot it is (its
    schema, the snapshot's): a metadata file written under ``where`` that every reader
    reads as it reads the table, iceberg-rust's included, which takes no snapshot id."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    assert snapshot is not None, f"no snapshot {snapshot_id} in {table.name()}"
    with table.io.new_input(table.metadata_location).open() as stream:
        doc = json.loads(stream.read())
    doc["current-snapshot-id"] = snapshot_id
    doc["refs"] = {"main": {"snapshot-id": snapshot_id, "type": "branch"}}
    if snapshot.schema_id is not None:
        doc["current-schema-id"] = snapshot.schema_id
    path = where / f"{'.'.join(table.name())}-{snapshot_id}.metadata.json"
    path.write_text(json.dumps(doc))
    return StaticTable.from_metadata(path.as_uri(), properties=dict(table.io.properties))
