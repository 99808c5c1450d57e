"""What the executors know of a table's files: the descriptions that cross between the
driver and the executors, the Arrow schema files are written in, and where they go.

Below the apply and the sink in the layers: the executors write files and describe
them with these small, picklable values; the sink lists and commits them with the same
values. Neither needs the other to say what a file is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from sparkapply import location

# Reserved field ids of the position-delete file schema (Iceberg spec).
FILE_PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545


@dataclass(frozen=True, slots=True)
class DataFileInfo:
    """One live data file of a table's current snapshot, as executors need it."""

    path: str
    """As recorded in the manifest (a URI such as ``file:///…`` or ``s3://…``);
    this exact string names the file in ``commit_files(removed=…)``."""
    record_count: int
    file_size_in_bytes: int
    # Bounds of the single key column (Python values), when the manifest has them.
    key_lower: object = None
    key_upper: object = None


@dataclass(frozen=True, slots=True)
class DeleteFileInfo:
    """A position-delete file an executor wrote (small, picklable).

    ``lower_path``/``upper_path`` bound the data-file paths it names: readers skip a
    delete file whose range misses the data file they read.
    """

    path: str
    record_count: int
    file_size_in_bytes: int
    lower_path: str
    upper_path: str
    lower_pos: int
    upper_pos: int


def arrow_schema_of(table: Table) -> pa.Schema:
    """The Arrow schema every data file of ``table`` is written in: the current
    schema's names and types, each field (list elements too) carrying its Iceberg
    field id as ``PARQUET:field_id``, which pyarrow writes into the Parquet schema.

    The spec asks writers for field ids, and readers resolve a file's columns by
    them: a column replaced under its name (``sink/tables.py``) is a new id, so an
    older snapshot's files still read as the old column. Files written before ids
    were written are resolved through the table's name mapping instead.
    """
    schema = schema_to_pyarrow(table.schema(), include_field_ids=True)
    # Only the field ids: no schema-level metadata rides along into every file.
    return pa.schema(list(schema))


def empty_table(schema: pa.Schema) -> pa.Table:
    """No rows in ``schema``. Not ``schema.empty_table()``: pyarrow cannot make an
    empty list of an extension type that way (a ``uuid[]`` column is a list of
    ``arrow.uuid``: ArrowNotImplementedError "extension")."""
    return pa.Table.from_batches([], schema)


def python_array(values: list[object], arrow_type: pa.DataType) -> pa.Array:
    """``values`` as ``to_pylist`` gives them, as an array of ``arrow_type``. pyarrow
    makes a list of an extension type from Python values only by way of the
    extension's storage type, then a cast."""
    storage = _storage_type(arrow_type)
    if storage is arrow_type:
        return pa.array(values, arrow_type)
    return pa.array(values, storage).cast(arrow_type)


def _storage_type(arrow_type: pa.DataType) -> pa.DataType:
    """``arrow_type`` with every extension type replaced by its storage type; the
    same object when it has none."""
    if isinstance(arrow_type, pa.BaseExtensionType):
        return _storage_type(arrow_type.storage_type)
    if pa.types.is_large_list(arrow_type) or pa.types.is_list(arrow_type):
        value = _storage_type(arrow_type.value_type)
        if value is arrow_type.value_type:
            return arrow_type
        field = arrow_type.value_field.with_type(value)
        return pa.large_list(field) if pa.types.is_large_list(arrow_type) else pa.list_(field)
    return arrow_type


def data_directory(table: Table) -> str:
    """Where executors write new data files (honours ``write.data.path``), as a URI.

    Created when it is on the local file system (pyarrow's local writer does not
    create parent directories); object stores need none. Executors must give each
    file a name that is unique forever (a UUID): a name reused after a failed commit
    could collide with a file a reader still needs.
    """
    data_path = table.location_provider().data_path
    local = location.local_path(data_path)
    if local is not None:
        os.makedirs(local, exist_ok=True)
    return data_path
