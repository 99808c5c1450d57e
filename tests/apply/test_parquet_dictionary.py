"""Data files dictionary-encode the columns whose values repeat, and only those: for
every column type the mapping makes, the file reads back as written, and its
column chunks say which encoding each got."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table

from sparkapply.apply.write.parquet import DICTIONARY_SAMPLE, TableWriter, dictionary_columns
from sparkapply.convert.types import relation_columns
from sparkapply.convert.values import arrow_schema
from sparkapply.datafiles import data_directory
from sparkapply.lsn import Lsn
from sparkapply.sink import commit_files, read_table
from tests.convert.test_schema import ALL_TYPES
from tests.readers import conform, read_with_duckdb, read_with_iceberg_rust
from tests.sink.executor_files import ORDERS_ARROW, order, to_arrow

ROWS = 3 * DICTIONARY_SAMPLE


def value(type_: pa.DataType, i: int) -> object:
    """The ``i``-th distinct value of a type."""
    if pa.types.is_boolean(type_):
        return i % 2 == 0
    if pa.types.is_integer(type_):
        return i
    if pa.types.is_floating(type_):
        return i / 4
    if pa.types.is_decimal(type_):
        return decimal.Decimal(i) / 100
    if pa.types.is_large_string(type_):
        return f"value {i}"
    if pa.types.is_large_binary(type_):
        return i.to_bytes(4, "big")
    if pa.types.is_date32(type_):
        return dt.date(2000, 1, 1) + dt.timedelta(days=i)
    if pa.types.is_time64(type_):
        return (
            dt.time(0, 0)
            if i == 0
            else (dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=i)).time()
        )
    if pa.types.is_timestamp(type_):
        base = dt.datetime(2000, 1, 1, tzinfo=dt.UTC if type_.tz else None)
        return base + dt.timedelta(seconds=i)
    if isinstance(type_, pa.BaseExtensionType):
        return uuid.UUID(int=i + 1).bytes
    if pa.types.is_large_list(type_):
        return [value(type_.value_type, i)]
    raise AssertionError(type_)


def column(field: pa.Field, repeat: bool) -> pa.Array:
    values = [value(field.type, i % 3 if repeat else i) for i in range(ROWS)]
    if isinstance(field.type, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(field.type, pa.array(values, field.type.storage_type))
    return pa.array(values, field.type)


REPEATED = {"small", "f8", "amount", "ok", "name", "data", "tstz", "u", "mood", "tags"}


@pytest.mark.parametrize("rows", [ROWS, DICTIONARY_SAMPLE])
def test_repeating_columns_get_a_dictionary(tmp_path: Path, rows: int) -> None:
    schema = arrow_schema(relation_columns(ALL_TYPES))
    table = pa.table(
        {f.name: column(f, f.name in REPEATED or f.type == pa.bool_()) for f in schema},
        schema=schema,
    ).slice(0, rows)
    chosen = dictionary_columns(table)
    flat_repeated = {n for n in REPEATED if not pa.types.is_nested(schema.field(n).type)}
    if rows <= DICTIONARY_SAMPLE:
        assert chosen is True  # a small file: every column, as pyarrow does
    else:
        assert isinstance(chosen, list) and set(chosen) == flat_repeated

    uri = TableWriter(str(tmp_path / "data"), schema).write(table)
    path = uri.removeprefix("file://")
    assert pq.read_table(path).equals(table)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encoded = {
        meta.column(i).path_in_schema: meta.column(i).has_dictionary_page
        for i in range(meta.num_columns)
    }
    # Parquet has no dictionary for booleans: they are bits already.
    for name in (f.name for f in schema if not pa.types.is_nested(f.type) and f.name != "ok"):
        assert encoded[name] is (rows <= DICTIONARY_SAMPLE or name in flat_repeated), name


def test_a_table_of_mixed_encodings_reads_the_same_in_every_reader(orders: Table) -> None:
    """A data file with a dictionary for some columns and not others, committed to a
    real table, reads the same in pyiceberg, DuckDB and iceberg-rust."""
    rows = [order(i, note=f"note {i % 3}") for i in range(1, ROWS + 1)]
    data = to_arrow(rows)
    assert dictionary_columns(data) == ["at", "note"]  # 60 and 3 values; the rest distinct
    path = TableWriter(data_directory(orders), ORDERS_ARROW).write(data)
    commit_files(orders, added=[path], lsn=Lsn(1))
    table = orders.refresh()
    expected = sorted(tuple(r.values()) for r in read_table(table).to_pylist())
    assert len(expected) == ROWS
    for name, read in (("duckdb", read_with_duckdb), ("iceberg-rust", read_with_iceberg_rust)):
        got = conform(read(table), read_table(table).schema, name, "orders")
        assert sorted(tuple(r.values()) for r in got.to_pylist()) == expected, name
