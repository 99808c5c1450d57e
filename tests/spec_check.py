"""What the Iceberg spec asks of the files the mirror leaves, checked on a table:

- every metadata file of the table parses in Java's ``TableMetadataParser`` (which
  refuses what the spec forbids) and says what pyiceberg reads in it;
- every manifest entry of every snapshot agrees with its file: the record count and
  size, and each column's null count where the entry has one;
- every data and delete file's Parquet schema carries field ids: the table schema's
  ids for data files (nested list elements included), the spec's reserved ids for a
  position-delete file's ``file_path`` and ``pos``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table
from pyiceberg.types import ListType

from tests.java_reader import shared_java_reader

FIELD_IDS_WRITTEN = True
"""sparkapply writes Parquet field ids (issue 46, part 1): every table ``assert_mirrored``
compares is checked for them."""

_FIELD_ID = b"PARQUET:field_id"
_POSITION_DELETE_IDS = {"file_path": 2147483546, "pos": 2147483545}


def assert_spec_conformant(table: Table, field_ids: bool = FIELD_IDS_WRITTEN) -> None:
    """``table``'s metadata files, manifests and data files as the module says;
    ``field_ids``: its Parquet files' field ids too."""
    name = ".".join(table.name())
    assert_metadata_parses_alike(table)
    problems: list[str] = []
    for data_file in _files(table):
        problems += _entry_problems(table, data_file, field_ids)
    assert not problems, f"{name}: {len(problems)} problems, e.g.\n  " + "\n  ".join(problems[:10])


def metadata_files(table: Table) -> list[str]:
    """Every metadata file in the table's metadata folder (a local warehouse), its
    current one included."""
    current = table.metadata_location
    folder = Path(unquote(urlsplit(current).path)).parent
    prefix = current[: current.rindex("/")]
    return sorted(f"{prefix}/{p.name}" for p in folder.glob("*.metadata.json"))


def assert_metadata_parses_alike(table: Table) -> None:
    """Java parses each metadata file of ``table`` and finds in it what pyiceberg
    does."""
    locations = metadata_files(table)
    assert table.metadata_location in locations, (table.metadata_location, locations)
    for row in shared_java_reader().parse_metadata(locations).to_pylist():
        where = row["location"]
        assert row["error"] is None, f"Java's TableMetadataParser refuses {where}: {row['error']}"
        mine = FromInputFile.table_metadata(table.io.new_input(where))
        expected = {
            "format_version": mine.format_version,
            "table_uuid": str(mine.table_uuid),
            "last_sequence_number": getattr(mine, "last_sequence_number", 0),  # v1: none
            "current_schema_id": mine.current_schema_id,
            "current_snapshot_id": mine.current_snapshot_id,
            "snapshot_ids": [s.snapshot_id for s in mine.snapshots],
        }
        java = {k: row[k] for k in expected}
        assert java == expected, f"{where}: Java reads {java}, pyiceberg {expected}"


def _files(table: Table) -> Iterator[DataFile]:
    """Every data and delete file of every snapshot, once."""
    seen: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.data_file.file_path not in seen:
                    seen.add(entry.data_file.file_path)
                    yield entry.data_file


def _entry_problems(table: Table, data_file: DataFile, field_ids: bool) -> list[str]:
    path = data_file.file_path
    with table.io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        meta = parquet.metadata
        schema = parquet.schema_arrow
    problems = []
    if data_file.record_count != meta.num_rows:
        problems.append(f"{path}: record_count {data_file.record_count}, {meta.num_rows} rows")
    size = len(table.io.new_input(path))
    if data_file.file_size_in_bytes != size:
        problems.append(f"{path}: file_size_in_bytes {data_file.file_size_in_bytes}, {size}")
    columns = _top_level_columns(table, schema)
    for field_id, expected in (data_file.null_value_counts or {}).items():
        column = columns.get(field_id)
        if column is not None:
            nulls = sum(
                meta.row_group(g).column(column).statistics.null_count
                for g in range(meta.num_row_groups)
            )
            if nulls != expected:
                problems.append(f"{path}: field {field_id} has {nulls} nulls, entry {expected}")
    if field_ids:
        problems += [f"{path}: {p}" for p in _field_id_problems(table, data_file, schema)]
    return problems


def _top_level_columns(table: Table, schema: pa.Schema) -> dict[int, int]:
    """Field id → Parquet leaf column index, for the file's top-level primitive columns:
    by the file's field ids, or by name (a file without them, as the name mapping
    resolves it)."""
    by_name: dict[str, set[int]] = {}
    for iceberg in table.metadata.schemas:
        for field in iceberg.fields:
            by_name.setdefault(field.name, set()).add(field.field_id)
    columns: dict[int, int] = {}
    leaf = 0
    for field in schema:
        if not pa.types.is_nested(field.type):
            if field.metadata and _FIELD_ID in field.metadata:
                columns[int(field.metadata[_FIELD_ID])] = leaf
            else:
                columns.update(dict.fromkeys(by_name.get(field.name, ()), leaf))
        leaf += _leaves(field.type)
    return columns


def _leaves(data_type: pa.DataType) -> int:
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _leaves(data_type.value_type)
    if pa.types.is_struct(data_type):
        return sum(_leaves(data_type.field(i).type) for i in range(data_type.num_fields))
    return 1


def _field_id_problems(table: Table, data_file: DataFile, schema: pa.Schema) -> list[str]:
    """The Parquet fields without the id the spec asks for."""
    expected: dict[str, set[int]] = {}
    if data_file.content == DataFileContent.POSITION_DELETES:
        expected = {name: {i} for name, i in _POSITION_DELETE_IDS.items()}
    else:
        # Any of the table's schemas: a file keeps the names of the schema it was
        # written with, and a name dropped and added again has had two ids.
        for iceberg in table.metadata.schemas:
            for field in iceberg.fields:
                expected.setdefault(field.name, set()).add(field.field_id)
                if isinstance(field.field_type, ListType):
                    element = f"{field.name}.element"
                    expected.setdefault(element, set()).add(field.field_type.element_id)
    problems = []
    for name, field in _walk(schema):
        got = field.metadata.get(_FIELD_ID) if field.metadata else None
        want = expected.get(name, set())
        if got is None or int(got) not in want:
            problems.append(f"column {name} has field id {got!r}, the table's is {want}")
    return problems


def _walk(schema: pa.Schema) -> Iterator[tuple[str, pa.Field]]:
    """Every field, nested list elements as ``name.element``."""
    for field in schema:
        yield field.name, field
        data_type = field.type
        if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
            yield f"{field.name}.element", data_type.value_field
