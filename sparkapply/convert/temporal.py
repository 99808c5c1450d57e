"""Dates, times, timestamps and timestamptz; runs inside Spark executors.

Arrow's ISO-8601 parser takes the common text. The rare values it does not accept
(``infinity``, BC dates, years with more than four digits, UTC offsets with seconds
such as ``+05:53:28``, local mean time before 1900) are found with one regex kernel
pass, parsed one by one and patched in, so one ``infinity`` does not send a million
values down the slow path. Dates and timestamps clamp to 0001-01-01 ..
9999-12-31 23:59:59.999999 (``infinity`` to the upper end); ``24:00:00`` becomes
23:59:59.999999 (the reasons are in :mod:`sparkapply.convert.types`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.convert.kernels import NULL_TEXT, any_true
from sparkapply.convert.types import ColumnKind, ColumnTarget

_US_PER_DAY = 86_400_000_000

# The clamp range: 0001-01-01 .. 9999-12-31 (days since 1970-01-01) and the same in
# microseconds, ending at 23:59:59.999999.
DATE_MIN = -719_162
DATE_MAX = 2_932_896
TIMESTAMP_MIN = DATE_MIN * _US_PER_DAY
TIMESTAMP_MAX = (DATE_MAX + 1) * _US_PER_DAY - 1

_EPOCH_DAY = pa.scalar("1970-01-01 ", pa.large_string())
_EMPTY = pa.scalar("", pa.large_string())

# What Arrow's ISO-8601 parser takes; anything else (non-null) goes the per-value way.
_DATE_FAST = r"^\d{4}-\d\d-\d\d$"
_TIMESTAMP_FAST = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?$"
_TIMESTAMPTZ_FAST = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?[+-]\d\d(:\d\d)?$"

_DATE_TEXT = re.compile(r"(\d+)-(\d\d)-(\d\d)( BC)?")
_TIMESTAMP_TEXT = re.compile(
    r"(\d+)-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?"
)


def date(text: pa.Array, target: ColumnTarget) -> pa.Array:
    return _temporal(text, pa.date32(), pa.int32(), _DATE_FAST, _date_days, DATE_MIN, DATE_MAX)


def timestamp(text: pa.Array, target: ColumnTarget) -> pa.Array:
    with_tz = target.kind is ColumnKind.TIMESTAMPTZ
    return _temporal(
        text,
        target.arrow_type,
        pa.int64(),
        _TIMESTAMPTZ_FAST if with_tz else _TIMESTAMP_FAST,
        _timestamptz_micros if with_tz else _timestamp_micros,
        TIMESTAMP_MIN,
        TIMESTAMP_MAX,
    )


def _temporal(
    text: pa.Array,
    arrow_type: pa.DataType,
    storage: pa.DataType,
    fast_pattern: str,
    per_value: Callable[[str], int],
    lo: int,
    hi: int,
) -> pa.Array:
    try:
        out = pc.cast(text, arrow_type)
    except pa.ArrowInvalid:
        out = _with_specials(text, arrow_type, storage, fast_pattern, per_value)
    return _clamp(out, storage, lo, hi)


def _with_specials(
    text: pa.Array,
    arrow_type: pa.DataType,
    storage: pa.DataType,
    fast_pattern: str,
    per_value: Callable[[str], int],
) -> pa.Array:
    special = pc.fill_null(pc.invert(pc.match_substring_regex(text, fast_pattern)), False)
    replacements = [per_value(s) for s in text.filter(special).to_pylist()]
    out = pc.cast(pc.if_else(special, NULL_TEXT, text), arrow_type)
    return pc.replace_with_mask(out, special, pa.array(replacements, storage).view(arrow_type))


def _clamp(out: pa.Array, storage: pa.DataType, lo: int, hi: int) -> pa.Array:
    # Values near the ends can still leave the range after a UTC offset is applied
    # ('0001-01-01 00:00:00+01'); min_max is one cheap pass that is usually all we do.
    ints = out.view(storage)
    bounds = pc.min_max(ints)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or (low >= lo and high <= hi):
        return out
    lo_s, hi_s = pa.scalar(lo, storage), pa.scalar(hi, storage)
    clamped = pc.min_element_wise(
        pc.max_element_wise(ints, lo_s, skip_nulls=False), hi_s, skip_nulls=False
    )
    return clamped.view(out.type)


def _date_days(value: str) -> int:
    if value == "infinity":
        return DATE_MAX
    if value == "-infinity":
        return DATE_MIN
    m = _DATE_TEXT.fullmatch(value)
    if m is None:
        raise ValueError("not a PostgreSQL ISO date")
    year = _astronomical_year(m[1], m[4])
    days = _days_from_civil(year, int(m[2]), int(m[3]))
    return min(max(days, DATE_MIN), DATE_MAX)


def _timestamp_micros(value: str) -> int:
    return _micros(value, with_tz=False)


def _timestamptz_micros(value: str) -> int:
    return _micros(value, with_tz=True)


def _micros(value: str, *, with_tz: bool) -> int:
    if value == "infinity":
        return TIMESTAMP_MAX
    if value == "-infinity":
        return TIMESTAMP_MIN
    m = _TIMESTAMP_TEXT.fullmatch(value)
    if m is None or (m[8] is not None) != with_tz:
        kind = "timestamptz" if with_tz else "timestamp"
        raise ValueError(f"not a PostgreSQL ISO {kind}")
    year = _astronomical_year(m[1], m[12])
    days = _days_from_civil(year, int(m[2]), int(m[3]))
    hour, minute, second = int(m[4]), int(m[5]), int(m[6])
    if hour > 24 or minute > 59 or second > 60:
        raise ValueError("time of day out of range")
    seconds = days * 86_400 + hour * 3_600 + minute * 60 + second
    if with_tz:
        offset = int(m[9]) * 3_600 + int(m[10] or 0) * 60 + int(m[11] or 0)
        # The text is local time at that offset east of UTC: UTC = local - offset.
        seconds -= offset if m[8] == "+" else -offset
    micros = seconds * 1_000_000 + (int(m[7].ljust(6, "0")) if m[7] else 0)
    return min(max(micros, TIMESTAMP_MIN), TIMESTAMP_MAX)


def _astronomical_year(digits: str, bc: str | None) -> int:
    # 1 BC is year 0, 2 BC is year -1 (PostgreSQL has no year 0 in its text form).
    year = int(digits)
    return 1 - year if bc else year


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date, for any year (H. Hinnant)."""
    if not (1 <= month <= 12 and 1 <= day <= 31):
        raise ValueError("month or day out of range")
    y = year - 1 if month <= 2 else year
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def time(text: pa.Array, target: ColumnTarget) -> pa.Array:
    # PostgreSQL allows 24:00:00; Iceberg (and Arrow) time is below 24 hours, so it
    # becomes the last microsecond of the day (documented in types.py).
    midnight = pc.equal(text, "24:00:00")
    if any_true(midnight):
        text = pc.if_else(midnight, pa.scalar("23:59:59.999999", pa.large_string()), text)
    # Arrow cannot cast text to time64, but parses timestamps: put the time on the epoch.
    stamped = pc.binary_join_element_wise(_EPOCH_DAY, text, _EMPTY)
    micros = pc.cast(stamped, pa.timestamp("us")).view(pa.int64())
    return micros.view(pa.time64("us"))
