"""Dates, times and timestamps from the text PostgreSQL 16 prints (DateStyle ISO)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapply.convert.temporal import DATE_MAX, DATE_MIN, TIMESTAMP_MAX, TIMESTAMP_MIN
from sparkapply.convert.types import PgColumnType
from sparkapply.convert.values import to_arrow
from sparkapply.errors import ConversionError
from tests.convert.pgtext import (
    DATE,
    MAX_DATE,
    MAX_TS,
    MIN_DATE,
    MIN_TS,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    UTC,
    convert,
    micros,
)

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
