"""Independent readers of the mirror, beside pyiceberg's own scan: DuckDB's iceberg
extension (from PyPI), iceberg-rust (pyiceberg-core's DataFusion table provider) and
Iceberg's Java runtime in Spark 3.5 (:mod:`tests.java_reader`), the format's reference
implementation. Every table sparkapply writes must read the same in all four: a spec
slip (a missing name mapping, a wrong physical type, a delete file another engine
resolves differently) shows up in one of them. Where they disagree with Java, Java is
taken for right until shown otherwise.

Each reader returns Arrow in its own representation. :func:`conform` turns a reader's
table into the Arrow schema pyiceberg gives, so that the Python values compare; it
accepts only the differences listed there, which are representation only (the same
values, typed differently), and fails on any other type difference.
"""

from __future__ import annotations

import glob
import os
import uuid
from collections.abc import Callable
from types import ModuleType, TracebackType

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import pyarrow as pa
from pyiceberg.table import Table
from pyiceberg.types import ListType

from tests.field_ids import file_ids, live_data_files
from tests.java_reader import shared_java_reader, spark_unreadable
from tests.rust_reader import shared_reader

READERS = ("duckdb", "iceberg-rust", "java")
"""The readers beside pyiceberg, by the names messages use."""

AT_SNAPSHOT = ("duckdb", "java")
"""The readers that read a given snapshot (a cut's), not only the current one:
pyiceberg-core's DataFusion provider reads the current snapshot only."""


def _extension(module: ModuleType, name: str) -> str:
    root = os.path.dirname(module.__file__ or "")
    found = glob.glob(os.path.join(root, "extensions", "*", f"{name}.duckdb_extension"))
    assert found, f"the {name} extension is not in {module.__name__}"
    return found[0]


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"LOAD '{_extension(duckdb_extension_avro, 'avro')}'")
    con.execute(f"LOAD '{_extension(duckdb_extension_iceberg, 'iceberg')}'")
    return con


def read_with_duckdb(
    table: Table, con: duckdb.DuckDBPyConnection | None = None, snapshot_id: int | None = None
) -> pa.Table:
    """The table's current snapshot, or ``snapshot_id``, as DuckDB's iceberg_scan reads it
    (on ``con``, or on a connection of its own)."""
    own = con is None
    con = duckdb_connection() if con is None else con
    try:
        if snapshot_id is None:
            query = "SELECT * FROM iceberg_scan(?)"
            params: list[object] = [table.metadata_location]
        else:
            query = "SELECT * FROM iceberg_scan(?, snapshot_from_id => ?)"
            params = [table.metadata_location, snapshot_id]
        return con.execute(query, params).to_arrow_table()
    finally:
        if own:
            con.close()


def read_with_iceberg_rust(table: Table, columns: list[str] | None = None) -> pa.Table:
    """The table's current snapshot (``columns`` of it, or all) as iceberg-rust reads it:
    pyiceberg-core's DataFusion table provider for the same metadata file, in the test
    run's reader process (:mod:`tests.rust_reader` says why a process)."""
    return shared_reader().read(table, columns)


def read_with_java(
    table: Table, columns: list[str] | None = None, snapshot_id: int | None = None
) -> pa.Table:
    """The table's current snapshot, or ``snapshot_id`` (``columns`` of it, or all), as
    Iceberg's Java runtime reads the same metadata file in Spark 3.5, in the test run's
    Java reader process (:mod:`tests.java_reader`)."""
    return shared_java_reader().read(table, columns, snapshot_id)


def unreadable(reader: str, table: Table) -> list[str]:
    """The columns of ``table`` that ``reader`` cannot read at all: known limitations of
    the reader, not of the table. They are left out of that reader's comparison only.

    iceberg-rust: a list column that a live data file does not hold by its field id.
    Its reader (iceberg-rust 0.10, in pyiceberg-core 0.10.1) cannot make the column of
    nulls such a file reads as: "unexpected target column type List(…)". That is a
    list column added after the file was written (apache/iceberg-rust#2618), and any
    list column in a file written without field ids (by sparkapply before it wrote
    them), whose element the name mapping does not reach (apache/iceberg-rust#1845).
    Files sparkapply writes now carry ids, so a list column every file holds is read.
    """
    if reader == "java":
        return spark_unreadable(table)  # a table with a time column: all of it
    if reader != "iceberg-rust":
        return []
    lists = [f for f in table.schema().fields if isinstance(f.field_type, ListType)]
    held = [file_ids(path) for path in live_data_files(table)] if lists else []
    return [f.name for f in lists if any(ids.get((f.name,)) != f.field_id for ids in held)]


def can_read(reader: str, table: Table) -> bool:
    """Whether ``reader`` reads any column of ``table`` (:func:`unreadable`)."""
    return len(unreadable(reader, table)) < len(table.schema().fields)


class Readers:
    """One DuckDB connection (and the run's iceberg-rust and Java processes), for reading
    several tables."""

    def __init__(self) -> None:
        self._duckdb = duckdb_connection()

    def read(self, reader: str, table: Table, snapshot_id: int | None = None) -> pa.Table:
        """``table`` as ``reader`` (one of :data:`READERS`) reads it, at its current
        snapshot or at ``snapshot_id`` (readers of :data:`AT_SNAPSHOT`), in the reader's
        own representation, without the columns it cannot read (:func:`unreadable`)."""
        skip = unreadable(reader, table)
        columns = [f.name for f in table.schema().fields if f.name not in skip]
        if snapshot_id is not None and reader not in AT_SNAPSHOT:
            raise ValueError(f"{reader} reads the current snapshot only")
        if reader == "duckdb":
            arrow = read_with_duckdb(table, self._duckdb, snapshot_id)
            return arrow.select(columns) if skip else arrow
        if reader == "iceberg-rust":
            return read_with_iceberg_rust(table, columns if skip else None)
        if reader == "java":
            return read_with_java(table, columns if skip else None, snapshot_id)
        raise ValueError(f"no reader {reader!r}")

    def read_like(
        self,
        reader: str,
        table: Table,
        like: pa.Schema,
        name: str,
        snapshot_id: int | None = None,
    ) -> pa.Table:
        """:meth:`read`, conformed to pyiceberg's schema ``like`` (:func:`conform`), less
        the columns the reader cannot read; ``name`` is the table in messages."""
        arrow = self.read(reader, table, snapshot_id)
        skip = unreadable(reader, table)
        kept = pa.schema([f for f in like if f.name not in skip])
        return conform(arrow, kept, reader, name)

    def close(self) -> None:
        self._duckdb.close()

    def __enter__(self) -> Readers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# CONFORMING A READER'S ARROW TO PYICEBERG'S
#
# Representation only (the same values, another Arrow type), accepted and converted:
# - string, binary: DuckDB, DataFusion and Spark give 32-bit offsets (string, binary),
#   pyiceberg 64-bit ones (large_string, large_binary);
# - list: likewise list against large_list, and another element field name (DuckDB "l",
#   DataFusion, Spark and pyiceberg "element"); elements are conformed the same way;
# - uuid: pyiceberg gives the arrow.uuid extension type, DataFusion its storage
#   (fixed_size_binary(16)), DuckDB and Spark the canonical text form ('6f059f3b-275a-…');
# - timestamptz: the same UTC instants, with the zone spelled "UTC" (pyiceberg, Spark
#   in a UTC session), "+00:00" (DataFusion) or "Etc/UTC" (DuckDB);
# - Parquet field-id metadata on DataFusion's fields.
# Anything else that differs in type fails: it is no representation a reader is known
# to choose, so it may be a real difference in what the reader found in the files.

_UTC = frozenset({"UTC", "+00:00", "Etc/UTC", "Z"})


def _same_timestamps(source: pa.DataType, target: pa.TimestampType) -> bool:
    """Whether ``source`` is ``target`` with another spelling of UTC."""

    def zone(tz: str | None) -> str | None:
        return "UTC" if tz in _UTC else tz

    return (
        pa.types.is_timestamp(source)
        and source.unit == target.unit
        and zone(source.tz) == zone(target.tz)
    )


def _uuid_bytes(text: object) -> bytes | None:
    return None if text is None else uuid.UUID(str(text)).bytes


def _conform_array(arr: pa.Array, target: pa.DataType, where: Callable[[], str]) -> pa.Array:
    source = arr.type
    if source == target:
        return arr
    if isinstance(target, pa.UuidType):
        if pa.types.is_fixed_size_binary(source) and source.byte_width == 16:
            return pa.ExtensionArray.from_storage(target, arr)
        if pa.types.is_string(source) or pa.types.is_large_string(source):
            storage = pa.array([_uuid_bytes(v) for v in arr.to_pylist()], pa.binary(16))
            return pa.ExtensionArray.from_storage(target, storage)
    elif pa.types.is_large_list(target):
        if pa.types.is_list(source) or pa.types.is_large_list(source):
            values = _conform_array(arr.values, target.value_type, where)
            offsets = arr.offsets.cast(pa.int64())
            mask = arr.is_null() if arr.null_count else None
            return pa.LargeListArray.from_arrays(offsets, values, type=target, mask=mask)
    elif pa.types.is_large_string(target):
        if pa.types.is_string(source) or pa.types.is_string_view(source):
            return arr.cast(target)
    elif pa.types.is_large_binary(target):
        if pa.types.is_binary(source) or pa.types.is_binary_view(source):
            return arr.cast(target)
    elif pa.types.is_timestamp(target) and _same_timestamps(source, target):
        return arr.cast(target)
    raise AssertionError(f"{where()}: read as {source}, pyiceberg reads {target}")


def conform(arrow: pa.Table, like: pa.Schema, reader: str, table: str) -> pa.Table:
    """``arrow``, as ``reader`` read ``table``, in pyiceberg's schema ``like``: the same
    columns in the same order, with the representation-only differences above undone."""
    missing = [n for n in like.names if n not in arrow.column_names]
    extra = [n for n in arrow.column_names if n not in like.names]
    assert not missing and not extra, (
        f"{reader} reads {table} with other columns than pyiceberg: "
        f"missing {missing}, extra {extra}"
    )
    columns = []
    for field in like:
        column = arrow.column(field.name)

        def where(name: str = field.name) -> str:
            return f"{reader} {table}.{name}"

        chunks = [_conform_array(c, field.type, where) for c in column.chunks]
        columns.append(pa.chunked_array(chunks, type=field.type))
    return pa.Table.from_arrays(columns, schema=like)
