"""The conversion as a whole: inputs, errors found by bisection, tables, Parquet."""

from __future__ import annotations

import datetime as dt
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.convert.types import PgColumnType
from sparkapply.convert.values import arrow_schema, to_arrow, to_arrow_table
from sparkapply.errors import ConversionError
from tests.convert.pgtext import (
    BOOL,
    BYTEA,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT4_ARRAY,
    INT8,
    MAX_DATE,
    NUMERIC,
    TEXT,
    TEXT_ARRAY,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    UTC,
    UUID,
    convert,
    numeric,
)


def test_arrow_inputs_are_accepted() -> None:
    raw = pa.array([b"zz", b"1", None, b"3"], pa.binary()).slice(1)
    assert to_arrow(INT4, raw).to_pylist() == [1, None, 3]
    text = pa.chunked_array([["2024-01-01"], [None, "infinity"]], pa.large_string())
    assert to_arrow(DATE, text).to_pylist() == [dt.date(2024, 1, 1), None, MAX_DATE]
    assert to_arrow(UUID, pa.array([], pa.string())).to_pylist() == []


def test_empty_and_all_null_columns() -> None:
    for ctype in (INT4, NUMERIC, numeric(10, 2), BOOL, BYTEA, UUID, DATE, TIME, TIMESTAMPTZ):
        assert to_arrow(ctype, []).to_pylist() == []
        assert to_arrow(ctype, [None, None]).to_pylist() == [None, None]
    assert to_arrow(INT4_ARRAY, [None]).to_pylist() == [None]


def test_error_value_is_truncated_and_error_is_picklable() -> None:
    long_value = "9" * 200
    with pytest.raises(ConversionError) as info:
        convert(INT8, "1", long_value, "2")
    err = info.value
    assert "'" + "9" * 80 + "...'" in str(err)
    assert "9" * 81 not in str(err)
    err.with_context(relation="public.t", column="n", xid=42)
    clone = pickle.loads(pickle.dumps(err))
    assert str(clone) == str(err)
    assert "column n" in str(clone)


def test_the_first_bad_value_is_found_in_a_large_column() -> None:
    values: list[bytes | None] = [b"1"] * 100_000
    values[77_777] = b"x77"
    values[88_888] = b"x88"
    with pytest.raises(ConversionError, match="'x77'"):
        to_arrow(INT4, values)


def test_to_arrow_table() -> None:
    columns = [("id", INT8), ("name", TEXT), ("at", TIMESTAMPTZ), ("tags", TEXT_ARRAY)]
    rows = [
        (b"1", b"one", b"2024-01-01 00:00:00+00", b"{a,b}"),
        (b"2", None, None, b"{}"),
    ]
    table = to_arrow_table(columns, rows)
    assert table.schema == arrow_schema(columns)
    assert table.to_pylist() == [
        {"id": 1, "name": "one", "at": dt.datetime(2024, 1, 1, tzinfo=UTC), "tags": ["a", "b"]},
        {"id": 2, "name": None, "at": None, "tags": []},
    ]
    empty = to_arrow_table(columns, [])
    assert empty.num_rows == 0 and empty.schema == arrow_schema(columns)


def test_to_arrow_table_errors_name_the_column() -> None:
    with pytest.raises(ConversionError) as info:
        to_arrow_table([("id", INT4), ("n", INT4)], [(b"1", b"2"), (b"3", b"four")])
    assert info.value.context["column"] == "n"
    with pytest.raises(ConversionError, match="row 1 has 1 values for 2 columns"):
        to_arrow_table([("id", INT4), ("n", INT4)], [(b"1", b"2"), (b"3",)])


def test_parquet_round_trip_keeps_types(tmp_path: Path) -> None:
    columns = [
        ("i2", INT2),
        ("i8", INT8),
        ("f4", FLOAT4),
        ("f8", FLOAT8),
        ("dec", numeric(38, 9)),
        ("num", NUMERIC),
        ("b", BOOL),
        ("t", TEXT),
        ("bin", BYTEA),
        ("d", DATE),
        ("tm", TIME),
        ("ts", TIMESTAMP),
        ("tstz", TIMESTAMPTZ),
        ("u", UUID),
        ("ints", INT4_ARRAY),
        ("uuids", PgColumnType(2951, -1)),
    ]
    texts = [
        "-32768",
        "9223372036854775807",
        "Infinity",
        "-Infinity",
        "12345678901234567890123456789.123456789",
        "NaN",
        "t",
        "héllo",
        "\\x00ff",
        "infinity",
        "24:00:00",
        "2024-02-29 23:59:59.999999",
        "2024-02-29 23:59:59.999999+00",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "{1,NULL}",
        "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
    ]
    rows: list[tuple[bytes | None, ...]] = [
        tuple(t.encode() for t in texts),
        (None,) * len(columns),
    ]
    table = to_arrow_table(columns, rows)
    path = tmp_path / "converted.parquet"
    pq.write_table(table, path)
    back = pq.read_table(path)
    assert back.schema == table.schema
    assert back.schema.field("u").type == pa.uuid()
    assert back.equals(table)
    # The Parquet column carries the UUID logical type, as the Iceberg spec asks.
    physical = pq.ParquetFile(path).schema.column(13)
    assert physical.physical_type == "FIXED_LEN_BYTE_ARRAY"
    assert str(physical.logical_type) == "UUID"


def test_values_module_imports_only_pyarrow() -> None:
    # It runs in Spark executors: no pyiceberg, no pyspark.
    code = (
        "import sys, sparkapply.convert.values; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyiceberg', 'pyspark')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
