"""Numbers, booleans, text, bytea and uuid from the text PostgreSQL 16 prints."""

from __future__ import annotations

import math
import struct
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapply.convert.types import PgColumnType
from sparkapply.convert.values import to_arrow
from sparkapply.errors import ConversionError
from tests.convert.pgtext import (
    BOOL,
    BPCHAR,
    BYTEA,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    INTERVAL,
    JSONB,
    MAX_18_4,
    NUMERIC,
    OID,
    TEXT,
    TIMETZ,
    UUID,
    convert,
    numeric,
)

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
# Properties: PostgreSQL's text form of generated values converts back to them
# --------------------------------------------------------------------------------


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
