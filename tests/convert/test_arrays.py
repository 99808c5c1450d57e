"""Array columns from the literals PostgreSQL 16's array_out prints."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal

import pytest

from sparkapply.convert.types import PgColumnType
from sparkapply.errors import ConversionError
from tests.convert.pgtext import (
    INT4_ARRAY,
    INT8_ARRAY,
    MAX_DATE,
    MAX_TS,
    TEXT_ARRAY,
    UTC,
    convert,
    numeric,
)


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


def test_an_array_the_table_stores_as_text_is_converted_as_text() -> None:
    """A column declared int4[][] is mirrored as text; its stream values, which the
    RELATION types int4[], are converted to the stored type: the literal, unchanged."""
    import pyarrow as pa

    from sparkapply.apply.write.columns import convert_column

    literals = [b"{{1,2},{3,4}}", None, b"[0:1][1:1]={{5},{6}}", b"{7}"]
    as_text = convert_column(INT4_ARRAY, literals, pa.field("m", pa.large_string()))
    assert as_text.to_pylist() == ["{{1,2},{3,4}}", None, "[0:1][1:1]={{5},{6}}", "{7}"]
    as_list = convert_column(INT4_ARRAY, [b"{7}"], pa.field("m", pa.large_list(pa.int32())))
    assert as_list.to_pylist() == [[7]]
    with pytest.raises(ConversionError, match="multi-dimensional") as info:
        convert_column(INT4_ARRAY, literals, pa.field("m", pa.large_list(pa.int32())))
    assert info.value.context["column"] == "m" and "resync" in (info.value.hint or "")
