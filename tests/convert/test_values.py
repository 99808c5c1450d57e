"""Text-format PostgreSQL values to Arrow, fed the exact text PostgreSQL 16 prints.

The connection settings are the replication connection's: datestyle=ISO,
intervalstyle=postgres, extra_float_digits=3, UTF8, bytea_output=hex.
"""

from __future__ import annotations

import datetime as dt
import math
import pickle
import struct
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapply.convert.types import PgColumnType, column_target
from sparkapply.convert.values import (
    DATE_MAX,
    DATE_MIN,
    TIMESTAMP_MAX,
    TIMESTAMP_MIN,
    arrow_schema,
    to_arrow,
    to_arrow_table,
)
from sparkapply.errors import ConversionError

UTC = dt.UTC

INT2, INT4, INT8, OID = (PgColumnType(o, -1) for o in (21, 23, 20, 26))
FLOAT4, FLOAT8 = PgColumnType(700, -1), PgColumnType(701, -1)
NUMERIC = PgColumnType(1700, -1)
BOOL, TEXT, BPCHAR, BYTEA = (PgColumnType(o, -1) for o in (16, 25, 1042, 17))
JSONB, INTERVAL, TIMETZ = (PgColumnType(o, -1) for o in (3802, 1186, 1266))
DATE, TIME, TIMESTAMP, TIMESTAMPTZ = (PgColumnType(o, -1) for o in (1082, 1083, 1114, 1184))
UUID = PgColumnType(2950, -1)
INT4_ARRAY, TEXT_ARRAY, INT8_ARRAY = (PgColumnType(o, -1) for o in (1007, 1009, 1016))

MAX_DATE = dt.date(9999, 12, 31)
MIN_DATE = dt.date(1, 1, 1)
MAX_TS = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
MIN_TS = dt.datetime(1, 1, 1)
MAX_18_4 = Decimal("99999999999999.9999")


def numeric(precision: int, scale: int) -> PgColumnType:
    return PgColumnType(1700, ((precision << 16) | (scale & 0x7FF)) + 4)


def convert(ctype: PgColumnType, *texts: str | None) -> list[object]:
    values = [None if t is None else t.encode() for t in texts]
    result = to_arrow(ctype, values)
    assert result.type == column_target(ctype).arrow_type
    assert len(result) == len(values)
    out: list[object] = result.to_pylist()
    return out


def micros(value: pa.Array) -> list[int | None]:
    """Timestamps as raw microseconds (to_pylist cannot show years beyond 9999)."""
    ints: list[int | None] = value.view(pa.int64()).to_pylist()
    return ints


# --------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------


def test_integers() -> None:
    assert convert(INT2, "-32768", "32767", None) == [-32768, 32767, None]
    assert convert(INT4, "-2147483648", "2147483647", "0") == [-(2**31), 2**31 - 1, 0]
    assert convert(INT8, "-9223372036854775808", "9223372036854775807") == [-(2**63), 2**63 - 1]
    assert convert(OID, "4294967295") == [4294967295]


def test_integer_overflow_names_the_value() -> None:
    with pytest.raises(ConversionError) as info:
        convert(INT4, "1", "2147483648", "3")
    message = str(info.value)
    assert "int4" in message and "'2147483648'" in message


def test_float4_is_bit_exact() -> None:
    texts = ["1.5", "0.1", "1e-45", "3.4028235e+38", "1.2345679e+08", "-2.5e-10"]
    got = convert(FLOAT4, *texts)
    for text, value in zip(texts, got, strict=True):
        # PostgreSQL prints the shortest text that reads back to the same float32.
        assert struct.pack("<f", value) == struct.pack("<f", float(text))


def test_float8() -> None:
    texts = ["0.1", "1e+300", "-1.7976931348623157e+308", "5e-324", "123456.789"]
    assert convert(FLOAT8, *texts) == [float(t) for t in texts]


@pytest.mark.parametrize("ctype", [FLOAT4, FLOAT8])
def test_float_specials_stay_ieee(ctype: PgColumnType) -> None:
    nan, inf, ninf, nzero, null = convert(ctype, "NaN", "Infinity", "-Infinity", "-0", None)
    assert isinstance(nan, float) and math.isnan(nan)
    assert inf == math.inf and ninf == -math.inf
    assert nzero == 0.0 and math.copysign(1.0, nzero) == -1.0
    assert null is None


def test_numeric_to_decimal_is_exact() -> None:
    assert convert(numeric(10, 2), "12345678.90", "-0.01", "0.00", None) == [
        Decimal("12345678.90"),
        Decimal("-0.01"),
        Decimal("0.00"),
        None,
    ]
    widest = "12345678901234567890123456789.123456789"
    assert convert(numeric(38, 9), widest, "-" + widest) == [Decimal(widest), Decimal("-" + widest)]
    assert convert(numeric(38, 0), "9" * 38) == [Decimal("9" * 38)]
    assert convert(numeric(38, 38), "0." + "1" * 38) == [Decimal("0." + "1" * 38)]


def test_numeric_nan_in_a_decimal_column_is_null() -> None:
    assert convert(numeric(10, 2), "1.00", "NaN", None) == [Decimal("1.00"), None, None]


def test_numeric_infinity_cannot_be_a_decimal() -> None:
    # PostgreSQL rejects it for numeric(p,s); if it ever arrives it is an error, not null.
    with pytest.raises(ConversionError, match="'Infinity'"):
        convert(numeric(10, 2), "1.00", "Infinity")


def test_numeric_too_wide_for_its_decimal_is_an_error() -> None:
    with pytest.raises(ConversionError, match=r"'123456789\.00'"):
        convert(numeric(10, 2), "123456789.00")


def test_unconstrained_and_wide_numeric_stay_text() -> None:
    texts = ["123456789012345678901234567890.123456789", "NaN", "Infinity", "-Infinity", "0"]
    assert convert(NUMERIC, *texts) == texts
    assert convert(numeric(39, 2), "1234567890123456789012345678901234567.89") == [
        "1234567890123456789012345678901234567.89"
    ]
    assert convert(numeric(5, -2), "12300") == ["12300"]


# --------------------------------------------------------------------------------
# Booleans, text, bytea, uuid
# --------------------------------------------------------------------------------


def test_booleans() -> None:
    assert convert(BOOL, "t", "f", None) == [True, False, None]


def test_boolean_rejects_other_spellings() -> None:
    with pytest.raises(ConversionError, match="'true'"):
        convert(BOOL, "t", "true")


def test_text_is_kept_verbatim() -> None:
    texts = ["", "héllo wörld ✓", "tab\there", "line\nbreak", "back\\slash", "NULL"]
    assert convert(TEXT, *texts, None) == [*texts, None]
    assert convert(BPCHAR, "ab   ") == ["ab   "]  # blank padding is part of the value
    assert convert(JSONB, '{"a": [1, 2.5, null]}') == ['{"a": [1, 2.5, null]}']
    assert convert(INTERVAL, "1 year 2 mons 3 days 04:05:06.7") == [
        "1 year 2 mons 3 days 04:05:06.7"
    ]
    assert convert(TIMETZ, "12:00:00+05:30") == ["12:00:00+05:30"]
    assert convert(PgColumnType(16500, -1, "public.mood"), "happy") == ["happy"]


def test_invalid_utf8_is_an_error() -> None:
    with pytest.raises(ConversionError, match="UTF8"):
        to_arrow(TEXT, [b"ok", b"\xff\xfe"])


def test_bytea_hex() -> None:
    assert convert(BYTEA, "\\x00ff", "\\x", None, "\\x48656c6c6f") == [
        b"\x00\xff",
        b"",
        None,
        b"Hello",
    ]


def test_bytea_escape_format() -> None:
    # bytea_output=escape: printable bytes as-is, backslash doubled, the rest \ooo.
    assert convert(BYTEA, "ab\\\\c\\000\\377", "\\x41", None) == [b"ab\\c\x00\xff", b"A", None]


@pytest.mark.parametrize("bad", ["\\x0", "\\xgg", "\\x00\\x01", "a\\9"])
def test_malformed_bytea(bad: str) -> None:
    with pytest.raises(ConversionError, match="bytea"):
        convert(BYTEA, "\\x00", bad)


def test_uuid() -> None:
    text = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    result = to_arrow(UUID, [text.encode(), None, b"00000000-0000-0000-0000-000000000000"])
    assert result.type == pa.uuid()
    assert result.to_pylist() == [uuid.UUID(text), None, uuid.UUID(int=0)]
    assert result.storage.to_pylist()[0] == uuid.UUID(text).bytes


@pytest.mark.parametrize("bad", ["a0eebc99", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1z", "x" * 36])
def test_malformed_uuid(bad: str) -> None:
    with pytest.raises(ConversionError, match="uuid"):
        convert(UUID, bad)


# --------------------------------------------------------------------------------
# Dates and times
# --------------------------------------------------------------------------------


def test_dates() -> None:
    assert convert(DATE, "2024-02-29", "1970-01-01", "0001-01-01", "9999-12-31", None) == [
        dt.date(2024, 2, 29),
        dt.date(1970, 1, 1),
        MIN_DATE,
        MAX_DATE,
        None,
    ]


def test_date_specials_clamp() -> None:
    texts = ["infinity", "-infinity", "4713-01-01 BC", "0001-12-31 BC", "10000-01-01"]
    assert convert(DATE, *texts, "5874897-12-31", "2024-01-01") == [
        MAX_DATE,
        MIN_DATE,
        MIN_DATE,
        MIN_DATE,
        MAX_DATE,
        MAX_DATE,
        dt.date(2024, 1, 1),
    ]
    days = to_arrow(DATE, [b"infinity", b"-infinity"]).view(pa.int32()).to_pylist()
    assert days == [DATE_MAX, DATE_MIN]


def test_times() -> None:
    assert convert(TIME, "00:00:00", "12:34:56.789", "23:59:59.999999", "08:00:00.5", None) == [
        dt.time(0, 0),
        dt.time(12, 34, 56, 789000),
        dt.time(23, 59, 59, 999999),
        dt.time(8, 0, 0, 500000),
        None,
    ]


def test_time_24_00_is_the_last_microsecond() -> None:
    assert convert(TIME, "24:00:00", "01:00:00") == [dt.time(23, 59, 59, 999999), dt.time(1)]


def test_timestamps() -> None:
    assert convert(
        TIMESTAMP,
        "2024-02-29 23:59:59.999999",
        "2024-02-29 23:59:59",
        "2024-02-29 23:59:59.5",
        "1900-01-01 00:00:00.000001",
        "0001-01-01 00:00:00",
        "9999-12-31 23:59:59.999999",
        None,
    ) == [
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
        dt.datetime(2024, 2, 29, 23, 59, 59),
        dt.datetime(2024, 2, 29, 23, 59, 59, 500000),
        dt.datetime(1900, 1, 1, 0, 0, 0, 1),
        MIN_TS,
        MAX_TS,
        None,
    ]


def test_timestamp_specials_clamp() -> None:
    result = to_arrow(
        TIMESTAMP,
        [
            b"infinity",
            b"-infinity",
            b"294276-12-31 23:59:59.999999",
            b"10000-01-01 00:00:00",
            b"4713-01-01 00:00:00 BC",
            b"0001-12-31 23:59:59.999999 BC",
            b"2024-01-01 12:00:00",
            None,
        ],
    )
    assert micros(result) == [
        TIMESTAMP_MAX,
        TIMESTAMP_MIN,
        TIMESTAMP_MAX,
        TIMESTAMP_MAX,
        TIMESTAMP_MIN,
        TIMESTAMP_MIN,
        1704110400000000,
        None,
    ]
    assert result.to_pylist()[:2] == [MAX_TS, MIN_TS]


def test_timestamptz_offsets() -> None:
    got = convert(
        TIMESTAMPTZ,
        "2024-02-29 23:59:59.999999+00",
        "2024-06-01 17:30:00.5+05:30",
        "2024-01-01 00:00:00-08",
        "2024-06-01 14:00:00+02",
        None,
    )
    assert got == [
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(2024, 6, 1, 12, 0, 0, 500000, tzinfo=UTC),
        dt.datetime(2024, 1, 1, 8, 0, tzinfo=UTC),
        dt.datetime(2024, 6, 1, 12, 0, tzinfo=UTC),
        None,
    ]


def test_timestamptz_with_a_seconds_offset() -> None:
    # TimeZone=Europe/Amsterdam prints local mean time before 1937 with a seconds offset.
    assert convert(
        TIMESTAMPTZ,
        "1900-01-01 00:19:32+00:19:32",
        "1900-01-01 00:00:00-00:19:32",
        "2024-01-01 00:00:00+00",
    ) == [
        dt.datetime(1900, 1, 1, tzinfo=UTC),
        dt.datetime(1900, 1, 1, 0, 19, 32, tzinfo=UTC),
        dt.datetime(2024, 1, 1, tzinfo=UTC),
    ]


def test_timestamptz_specials_clamp_in_utc() -> None:
    result = to_arrow(
        TIMESTAMPTZ,
        [
            b"infinity",
            b"-infinity",
            b"10000-01-01 00:00:00+00",
            b"10000-01-01 03:00:00+05",  # 9999-12-31 22:00 UTC: in range
            b"9999-12-31 23:00:00-05",  # 10000-01-01 04:00 UTC: clamped
            b"0001-01-01 00:00:00+01",  # 0000-12-31 23:00 UTC: clamped
            b"0001-01-01 05:53:28+05:53:28",  # Asia/Kolkata LMT: exactly the minimum
            b"0001-01-01 00:00:00+05:53:28 BC",
            None,
        ],
    )
    assert result.type == pa.timestamp("us", tz="UTC")
    max_minus_2h = TIMESTAMP_MAX - 2 * 3_600_000_000 + 1
    assert micros(result) == [
        TIMESTAMP_MAX,
        TIMESTAMP_MIN,
        TIMESTAMP_MAX,
        max_minus_2h,
        TIMESTAMP_MAX,
        TIMESTAMP_MIN,
        TIMESTAMP_MIN,
        TIMESTAMP_MIN,
        None,
    ]


def test_clamping_on_the_fast_path() -> None:
    # No special value: Arrow parses all of it, then the range check clamps.
    result = to_arrow(TIMESTAMPTZ, [b"0001-01-01 00:00:00+01", b"2024-01-01 00:00:00+00"])
    assert result.to_pylist() == [MIN_TS.replace(tzinfo=UTC), dt.datetime(2024, 1, 1, tzinfo=UTC)]


@pytest.mark.parametrize(
    ("ctype", "text"),
    [
        (TIMESTAMP, "2024-01-01 00:00:00+00"),
        (TIMESTAMPTZ, "2024-01-01 00:00:00"),
        (TIMESTAMP, "yesterday"),
        (DATE, "2024-13-01"),
        (TIME, "25:00:00"),
    ],
)
def test_malformed_temporal_values(ctype: PgColumnType, text: str) -> None:
    with pytest.raises(ConversionError) as info:
        convert(ctype, text)
    assert repr(text) in str(info.value)


# --------------------------------------------------------------------------------
# Arrays
# --------------------------------------------------------------------------------


def test_int_arrays() -> None:
    assert convert(INT4_ARRAY, "{1,2,NULL}", "{}", None, "{-2147483648}") == [
        [1, 2, None],
        [],
        None,
        [-(2**31)],
    ]


def test_array_lower_bounds_are_dropped() -> None:
    assert convert(INT4_ARRAY, "[0:1]={5,6}", "{7}") == [[5, 6], [7]]


def test_text_array_quoting() -> None:
    # SELECT ARRAY['a b', 'c"d', NULL, 'NULL', '', 'x\y', '{}', 'a,b']::text[]
    literal = r'{"a b","c\"d",NULL,"NULL","","x\\y","{}","a,b"}'
    assert convert(TEXT_ARRAY, literal, "{plain,words}") == [
        ["a b", 'c"d', None, "NULL", "", "x\\y", "{}", "a,b"],
        ["plain", "words"],
    ]


def test_arrays_of_other_types() -> None:
    assert convert(PgColumnType(1231, numeric(10, 2).type_modifier), "{1.50,NaN,NULL}") == [
        [Decimal("1.50"), None, None]
    ]
    assert convert(PgColumnType(1185, -1), '{"2024-01-01 05:30:00+05:30",infinity}') == [
        [dt.datetime(2024, 1, 1, tzinfo=UTC), MAX_TS.replace(tzinfo=UTC)]
    ]
    assert convert(PgColumnType(1001, -1), r'{"\\x01ff",NULL}') == [[b"\x01\xff", None]]
    assert convert(PgColumnType(2951, -1), "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}") == [
        [uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), None]
    ]
    assert convert(PgColumnType(3807, -1), r'{"{\"a\": 1}"}') == [['{"a": 1}']]
    assert convert(PgColumnType(1000, -1), "{t,f}") == [[True, False]]
    (floats,) = convert(PgColumnType(1021, -1), "{NaN,-Infinity,1.5}")
    assert isinstance(floats, list) and floats[1:] == [-math.inf, 1.5]
    assert convert(PgColumnType(1182, -1), "{2024-02-29,infinity}") == [
        [dt.date(2024, 2, 29), MAX_DATE]
    ]
    # box is the one built-in type whose array delimiter is ';'.
    assert convert(PgColumnType(1020, -1), "{(3,4),(1,2);(1,1),(0,0)}") == [
        ["(3,4),(1,2)", "(1,1),(0,0)"]
    ]


def test_split_and_parsed_arrays_agree() -> None:
    # Without quotes the column is split with Arrow kernels; one bounds-decorated value
    # sends the whole column through the per-value parser. Both give the same lists.
    literals = ["{1,2,NULL}", "{}", None, "{3}", "{NULL}", "{4,5,6,7}"]
    split = convert(INT8_ARRAY, *literals)
    parsed = convert(INT8_ARRAY, *literals, "[1:1]={8}")
    assert parsed == [*split, [8]]
    assert split == [[1, 2, None], [], None, [3], [None], [4, 5, 6, 7]]


def test_multidimensional_arrays_are_refused() -> None:
    with pytest.raises(ConversionError) as info:
        convert(INT4_ARRAY, "{1}", "{{1,2},{3,4}}")
    assert "multi-dimensional" in str(info.value)
    assert "'{{1,2},{3,4}}'" in str(info.value)
    assert info.value.hint
    with pytest.raises(ConversionError, match="multi-dimensional"):
        convert(INT4_ARRAY, "[0:1][1:2]={{1,2},{3,4}}")


@pytest.mark.parametrize("bad", ["{1,,2}", "{1,2", "1,2}", '{"a}', "{1,x}", "[0:1]{5,6}"])
def test_malformed_arrays(bad: str) -> None:
    with pytest.raises(ConversionError):
        convert(INT4_ARRAY, bad)


# --------------------------------------------------------------------------------
# Inputs, errors, tables
# --------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------
# Properties: PostgreSQL's text form of generated values converts back to them
# --------------------------------------------------------------------------------


def pg_timestamp(value: dt.datetime) -> str:
    """timestamp_out with DateStyle ISO: fraction printed only when non-zero, no
    trailing zeros."""
    text = value.strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1, 1, 1))), max_size=30))
def test_timestamp_property(values: list[dt.datetime | None]) -> None:
    texts = [None if v is None else pg_timestamp(v) for v in values]
    assert convert(TIMESTAMP, *texts) == values


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.datetimes(min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 12, 31)),
            st.integers(min_value=-15 * 60, max_value=15 * 60),  # offset in minutes
        ),
        max_size=30,
    )
)
def test_timestamptz_property(values: list[tuple[dt.datetime, int]]) -> None:
    texts = []
    for local, minutes in values:
        sign = "+" if minutes >= 0 else "-"
        hh, mm = divmod(abs(minutes), 60)
        texts.append(pg_timestamp(local) + f"{sign}{hh:02d}" + (f":{mm:02d}" if mm else ""))
    expected = [
        (local - dt.timedelta(minutes=minutes)).replace(tzinfo=UTC) for local, minutes in values
    ]
    assert convert(TIMESTAMPTZ, *texts) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(width=32)), max_size=30))
def test_float4_property(values: list[float | None]) -> None:
    def pg(v: float) -> str:
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return f"{v:.9g}"  # 9 significant digits always round-trip a float32

    got = convert(FLOAT4, *[None if v is None else pg(v) for v in values])
    for v, g in zip(values, got, strict=True):
        if v is None or g is None:
            assert v is g
        elif math.isnan(v):
            assert math.isnan(g)  # type: ignore[arg-type]  # PostgreSQL prints any NaN as NaN
        else:
            assert struct.pack("<f", v) == struct.pack("<f", g)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.decimals(places=4, min_value=-MAX_18_4, max_value=MAX_18_4)),
        max_size=30,
    )
)
def test_decimal_property(values: list[Decimal | None]) -> None:
    texts = [None if v is None else f"{v:.4f}" for v in values]
    got = convert(numeric(18, 4), *texts)
    assert got == values
