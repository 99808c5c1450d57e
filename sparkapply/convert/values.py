"""Columns of PostgreSQL text values to Arrow arrays; runs inside Spark executors.

This module owns the value conversion: one column of text-format values (the bytes
pgoutput sent, ``None`` for NULL) in, one Arrow array of the column's target type (see
:mod:`sparkapply.convert.types`) out. It imports only pyarrow and the standard library.

VECTORISED, NOT PER VALUE

A column is gathered once into an Arrow string array (one pass in C, validating UTF-8)
and then converted with ``pyarrow.compute`` kernels: casts for numbers, decimals,
dates and timestamps, ``equal`` for booleans, and for bytea and uuid a single
``binascii.a2b_hex`` over the whole character buffer, with new offsets computed by
kernels. Python
code runs per value only for arrays (the literal must be parsed) and for rare values
that Arrow's parsers do not accept: ``infinity``, BC dates, years with more than four
digits, UTC offsets with seconds (``+05:53:28``, local mean time before 1900),
``24:00:00``, and bytea in the ``escape`` output format. Those are found with one
regex kernel pass and patched in, so one ``infinity`` does not send a million values
down the slow path.

The server settings the source connection must set are what make this exact:
``datestyle=ISO`` (``2024-02-29 23:59:59.999999+00``), ``intervalstyle=postgres``,
``extra_float_digits`` >= 1 (floats print shortest-exact, so parsing them back is
bit-exact), UTF8, and ``bytea_output=hex`` for the fast bytea path (the escape format
is still decoded correctly, one value at a time).

SPECIAL VALUES

NaN and the infinities stay IEEE values in float columns; numeric NaN is null in a
decimal column; dates and timestamps clamp to 0001-01-01 .. 9999-12-31 23:59:59.999999
(``infinity`` to the upper end); ``24:00:00`` becomes 23:59:59.999999. The full table,
with the reasons, is in :mod:`sparkapply.convert.types`.

ERRORS

A value that does not convert raises :class:`ConversionError` naming the PostgreSQL
type, the target type and the offending value (at most 80 characters). The column is
converted as a whole, so the value is found afterwards by bisecting the column (log2 n
conversions of halving slices): the error path is slower, the happy path pays nothing.
Callers add the relation, column, xid and LSN with ``with_context``.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.convert.types import (
    ColumnKind,
    ColumnTarget,
    PgColumnType,
    column_target,
    pg_type_name,
)
from sparkapply.errors import ConversionError, UnrepresentableValueError

ColumnValues: TypeAlias = Sequence[bytes | None] | pa.Array | pa.ChunkedArray
"""One column: the text-format values (``None`` = NULL), or an Arrow (large) binary or
string array of them."""

_US_PER_DAY = 86_400_000_000

# The clamp range: 0001-01-01 .. 9999-12-31 (days since 1970-01-01) and the same in
# microseconds, ending at 23:59:59.999999.
DATE_MIN = -719_162
DATE_MAX = 2_932_896
TIMESTAMP_MIN = DATE_MIN * _US_PER_DAY
TIMESTAMP_MAX = (DATE_MAX + 1) * _US_PER_DAY - 1

_MAX_SHOWN = 80  # characters of an offending value shown in an error

_NULL_STRING = pa.scalar(None, pa.large_string())
_EPOCH_DAY = pa.scalar("1970-01-01 ", pa.large_string())
_EMPTY = pa.scalar("", pa.large_string())


# --------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------


def to_arrow(ctype: PgColumnType, values: ColumnValues) -> pa.Array:
    """Convert one column of PostgreSQL text values to an Arrow array.

    The result's type is ``column_target(ctype).arrow_type``; NULL (``None``) stays
    null. An unchanged TOAST value has no text: pass ``None`` for it and keep the
    "unchanged" mask beside the result. Raises :class:`ConversionError` naming the
    first value that does not convert.
    """
    target = column_target(ctype)
    raw = _gather(values)
    try:
        return _convert(raw, target)
    except (ValueError, OverflowError) as exc:  # ArrowInvalid, binascii.Error included
        raise _conversion_error(ctype, target, raw, exc) from exc


def arrow_schema(columns: Sequence[tuple[str, PgColumnType]]) -> pa.Schema:
    """The Arrow schema of converted columns (every field nullable)."""
    return pa.schema([pa.field(name, column_target(ct).arrow_type) for name, ct in columns])


def to_arrow_table(
    columns: Sequence[tuple[str, PgColumnType]],
    rows: Sequence[Sequence[bytes | None]],
) -> pa.Table:
    """Convert row-major text values (one sequence per row, in column order) to a table."""
    width = len(columns)
    bad = next((i for i, row in enumerate(rows) if len(row) != width), None)
    if bad is not None:
        raise ConversionError(f"row {bad} has {len(rows[bad])} values for {width} columns")
    by_column: list[Sequence[bytes | None]] = (
        list(zip(*rows, strict=True)) if rows else [()] * width
    )
    arrays = []
    for (name, ctype), values in zip(columns, by_column, strict=True):
        try:
            arrays.append(to_arrow(ctype, values))
        except ConversionError as exc:
            exc.with_context(column=name)
            raise
    return pa.Table.from_arrays(arrays, schema=arrow_schema(columns))


# --------------------------------------------------------------------------------
# Gathering and dispatch
# --------------------------------------------------------------------------------


def _gather(values: ColumnValues) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    # pa.binary() builds fastest from Python bytes; the later cast to large_string
    # validates UTF-8 and widens the offsets in one cheap pass. Past 2 GiB of text
    # pyarrow would return chunks; build with 64-bit offsets instead.
    raw = pa.array(values, type=pa.binary())
    if isinstance(raw, pa.ChunkedArray):
        raw = pa.array(values, type=pa.large_binary())
    return raw


def _convert(raw: pa.Array, target: ColumnTarget) -> pa.Array:
    text = raw if raw.type == pa.large_string() else raw.cast(pa.large_string())
    return _CONVERTERS[target.kind](text, target)


def _conversion_error(
    ctype: PgColumnType, target: ColumnTarget, raw: pa.Array, exc: BaseException
) -> ConversionError:
    where = f"PostgreSQL {pg_type_name(ctype)} to Iceberg {target.iceberg_name}"
    failure: BaseException | None = exc
    lo, hi = 0, len(raw)
    # Invariant: raw[lo:hi] fails. Conversion failures are per value, so one half of a
    # failing slice fails too; if neither does, the failure is not local: say so.
    while hi - lo > 1 and failure is not None:
        mid = (lo + hi) // 2
        if (err := _failure(raw.slice(lo, mid - lo), target)) is not None:
            hi, failure = mid, err
        elif (err := _failure(raw.slice(mid, hi - mid), target)) is not None:
            lo, failure = mid, err
        else:
            return ConversionError(f"cannot convert {where}: {_reason(exc)}")
    assert failure is not None
    value = raw[lo].as_py() if hi > lo else None
    return ConversionError(
        f"cannot convert {where}: value {_show(value)}: {_reason(failure)}",
        hint=getattr(failure, "hint", None),
    )


def _failure(raw: pa.Array, target: ColumnTarget) -> BaseException | None:
    try:
        _convert(raw, target)
    except (ValueError, OverflowError) as exc:
        return exc
    return None


# Arrow's parse errors repeat the whole value; the message shows it once, truncated.
_ARROW_PARSE_ERROR = re.compile(
    r"Failed to parse string: .* as a scalar of type ([^:]+)|"
    r"The string .* is not a valid (\w+) number",
    re.DOTALL,
)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    m = _ARROW_PARSE_ERROR.match(text)
    if m is not None:
        return f"not a valid {m[1] or m[2]}"
    text = text.splitlines()[0]
    return text if len(text) <= 160 else text[:157] + "..."


def _all(mask: pa.Array) -> bool:
    """True unless a non-null element is false (so also for an empty column)."""
    return pc.all(mask, min_count=0).as_py() is not False


def _any(mask: pa.Array) -> bool:
    """True if a non-null element is true."""
    return pc.any(mask, min_count=0).as_py() is True


def _show(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="backslashreplace")
    text = str(value)
    if len(text) > _MAX_SHOWN:
        text = text[:_MAX_SHOWN] + "..."
    return repr(text)


# --------------------------------------------------------------------------------
# Numbers, booleans, strings
# --------------------------------------------------------------------------------


def _cast_to(arrow_type: pa.DataType) -> Callable[[pa.Array, ColumnTarget], pa.Array]:
    # int2/int4/int8/oid and float4/float8: Arrow's parsers accept every form PostgreSQL
    # prints, including NaN, Infinity and -Infinity; float4 parses straight to float32,
    # so a shortest-exact float4 text reproduces the same bits.
    def convert(text: pa.Array, target: ColumnTarget) -> pa.Array:
        return pc.cast(text, arrow_type)

    return convert


def _decimal(text: pa.Array, target: ColumnTarget) -> pa.Array:
    # Arrow parses decimal text exactly (no float round-trip) and refuses to drop
    # digits, so an out-of-range value fails instead of rounding.
    arrow_type = target.arrow_type
    try:
        return pc.cast(text, arrow_type)
    except pa.ArrowInvalid:
        nan = pc.equal(text, "NaN")
        if not _any(nan):
            raise
    # A decimal has no NaN: it becomes null (documented in types.py).
    return pc.cast(pc.if_else(nan, _NULL_STRING, text), arrow_type)


def _boolean(text: pa.Array, target: ColumnTarget) -> pa.Array:
    is_true = pc.equal(text, "t")
    if not _all(pc.or_(is_true, pc.equal(text, "f"))):
        raise ValueError("a boolean is 't' or 'f'")
    return is_true


def _string(text: pa.Array, target: ColumnTarget) -> pa.Array:
    return text


# --------------------------------------------------------------------------------
# bytea and uuid: hex decoding of the whole character buffer at once
# --------------------------------------------------------------------------------


def _bytea(text: pa.Array, target: ColumnTarget) -> pa.Array:
    filled = text.fill_null("\\x") if text.null_count else text
    if not _all(pc.starts_with(filled, "\\x")):
        return _bytea_per_value(text)  # bytea_output = escape
    chars = bytes(_chars(filled))
    # Hex digits contain no backslash, so the only ones are the n '\x' prefixes and
    # dropping every '\x' from the buffer leaves exactly the digits, value after value.
    if chars.count(b"\\") != len(filled):
        raise ValueError("a hex bytea is '\\x' followed by hex digits")
    digit_counts = pc.subtract(pc.binary_length(filled), 2)
    if _any(pc.not_equal(pc.bit_wise_and(digit_counts, 1), 0)):
        raise ValueError("a hex bytea has an even number of digits")
    decoded = binascii.a2b_hex(chars.replace(b"\\x", b""))
    offsets = pa.concat_arrays(
        [pa.array([0], pa.int64()), pc.cumulative_sum(pc.shift_right(digit_counts, 1))]
    )
    out = pa.Array.from_buffers(
        pa.large_binary(), len(filled), [None, offsets.buffers()[1], pa.py_buffer(decoded)]
    )
    return _restore_nulls(out, text)


def _bytea_per_value(text: pa.Array) -> pa.Array:
    return pa.array(
        [None if v is None else _decode_bytea(v.encode()) for v in text.to_pylist()],
        type=pa.large_binary(),
    )


def _decode_bytea(value: bytes) -> bytes:
    if value.startswith(b"\\x"):
        return binascii.a2b_hex(value[2:])
    # Escape format: bytes as-is, except a backslash as '\\' and others as '\nnn'.
    out = bytearray()
    i, n = 0, len(value)
    while i < n:
        c = value[i]
        if c != 0x5C:
            out.append(c)
            i += 1
        elif value[i + 1 : i + 2] == b"\\":
            out.append(0x5C)
            i += 2
        else:
            octal = value[i + 1 : i + 4]
            if len(octal) != 3 or not all(0x30 <= d <= 0x37 for d in octal):
                raise ValueError("bad escape in bytea escape format")
            out.append(int(octal, 8))
            i += 4
    return bytes(out)


_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def _uuid(text: pa.Array, target: ColumnTarget) -> pa.Array:
    filled = text.fill_null(_ZERO_UUID) if text.null_count else text
    if not _all(pc.equal(pc.binary_length(filled), 36)):
        raise ValueError("a uuid has 36 characters")
    digits = pc.replace_substring(filled, "-", "")
    if not _all(pc.equal(pc.binary_length(digits), 32)):
        raise ValueError("a uuid is 32 hex digits in 8-4-4-4-12 groups")
    storage = pa.Array.from_buffers(
        pa.binary(16), len(text), [None, pa.py_buffer(binascii.a2b_hex(_chars(digits)))]
    )
    return pa.ExtensionArray.from_storage(pa.uuid(), _restore_nulls(storage, text))


def _chars(arr: pa.Array) -> memoryview:
    """The characters of a large string array, value after value, without a copy."""
    _, offsets_buf, data_buf = arr.buffers()
    offsets = pa.Array.from_buffers(pa.int64(), len(arr) + 1, [None, offsets_buf], 0, arr.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    return memoryview(data_buf)[start:end] if data_buf is not None else memoryview(b"")


def _restore_nulls(out: pa.Array, like: pa.Array) -> pa.Array:
    if not like.null_count:
        return out
    return pc.if_else(pc.is_valid(like), out, pa.scalar(None, out.type))


# --------------------------------------------------------------------------------
# date, time, timestamp, timestamptz
# --------------------------------------------------------------------------------

# What Arrow's ISO-8601 parser takes; anything else (non-null) goes the per-value way.
_DATE_FAST = r"^\d{4}-\d\d-\d\d$"
_TIMESTAMP_FAST = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?$"
_TIMESTAMPTZ_FAST = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?[+-]\d\d(:\d\d)?$"

_DATE_TEXT = re.compile(r"(\d+)-(\d\d)-(\d\d)( BC)?")
_TIMESTAMP_TEXT = re.compile(
    r"(\d+)-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?"
)


def _date(text: pa.Array, target: ColumnTarget) -> pa.Array:
    return _temporal(text, pa.date32(), pa.int32(), _DATE_FAST, _date_days, DATE_MIN, DATE_MAX)


def _timestamp(text: pa.Array, target: ColumnTarget) -> pa.Array:
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
    out = pc.cast(pc.if_else(special, _NULL_STRING, text), arrow_type)
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


def _time(text: pa.Array, target: ColumnTarget) -> pa.Array:
    # PostgreSQL allows 24:00:00; Iceberg (and Arrow) time is below 24 hours, so it
    # becomes the last microsecond of the day (documented in types.py).
    midnight = pc.equal(text, "24:00:00")
    if _any(midnight):
        text = pc.if_else(midnight, pa.scalar("23:59:59.999999", pa.large_string()), text)
    # Arrow cannot cast text to time64, but parses timestamps: put the time on the epoch.
    stamped = pc.binary_join_element_wise(_EPOCH_DAY, text, _EMPTY)
    micros = pc.cast(stamped, pa.timestamp("us")).view(pa.int64())
    return micros.view(pa.time64("us"))


# --------------------------------------------------------------------------------
# Arrays
# --------------------------------------------------------------------------------

_DIMENSIONS = re.compile(r"((?:\[-?\d+:-?\d+\])+)=")
_UNESCAPE = re.compile(r"\\(.)", re.DOTALL)
_ELEMENT_RE: dict[str, re.Pattern[str]] = {}


def _list(text: pa.Array, target: ColumnTarget) -> pa.Array:
    element = target.element
    assert element is not None
    split = _split_unquoted(text, target.delimiter)
    offsets, elements = split if split is not None else _split_each(text, target.delimiter)
    # The elements of the whole column convert as one vectorised column.
    values = _CONVERTERS[element.kind](elements, element)
    mask = pc.is_null(text) if text.null_count else None
    return pa.LargeListArray.from_arrays(offsets, values, type=target.arrow_type, mask=mask)


def _split_unquoted(text: pa.Array, delimiter: str) -> tuple[pa.Array, pa.Array] | None:
    """Split with kernels when no literal needs the parser, else None.

    That is the common case for numbers, dates, uuids and booleans: array_out quotes
    an element only if it holds a quote, backslash, brace, the delimiter or
    whitespace, is empty or reads NULL; so a body without quotes, backslashes and
    braces splits exactly at the delimiter, and no element of it is empty.
    """
    filled = text.fill_null("{}") if text.null_count else text
    if not (_all(pc.starts_with(filled, "{")) and _all(pc.ends_with(filled, "}"))):
        return None  # bounds decoration ('[0:1]={5,6}') or not an array literal
    body = pc.utf8_slice_codeunits(filled, 1, -1)
    if _any(pc.match_substring_regex(body, r'["{}\\]')):
        return None
    parts = pc.split_pattern(body, delimiter)
    empty = pc.equal(body, "")
    flat = pc.list_flatten(parts)
    blank = pc.equal(flat, "")
    # '{}' splits to one empty string; any other empty piece means a malformed literal.
    if pc.sum(blank).as_py() != pc.sum(empty).as_py():
        return None
    counts = pc.if_else(empty, 0, pc.list_value_length(parts).cast(pa.int64()))
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(counts)])
    kept = flat.filter(pc.invert(blank)).cast(pa.large_string())
    return offsets, pc.if_else(pc.equal(kept, "NULL"), _NULL_STRING, kept)


def _split_each(text: pa.Array, delimiter: str) -> tuple[pa.Array, pa.Array]:
    offsets = [0]
    elements: list[str | None] = []
    for literal in text.to_pylist():
        if literal is not None:
            elements.extend(_parse_array(literal, delimiter))
        offsets.append(len(elements))
    return pa.array(offsets, pa.int64()), pa.array(elements, pa.large_string())


def _parse_array(literal: str, delimiter: str) -> list[str | None]:
    """The elements of a one-dimensional PostgreSQL array literal (array_out's form)."""
    if literal.startswith("["):
        # Bounds decoration, printed when a lower bound is not 1: '[0:1]={5,6}'.
        m = _DIMENSIONS.match(literal)
        if m is None:
            raise ValueError("malformed array dimensions")
        if m[1].count("[") > 1:
            raise _multidimensional()
        literal = literal[m.end() :]
    if len(literal) < 2 or literal[0] != "{" or literal[-1] != "}":
        raise ValueError("an array literal is enclosed in braces")
    body = literal[1:-1]
    if not body:
        return []
    if body[0] == "{":
        raise _multidimensional()
    if '"' not in body:
        # array_out quotes every element that holds a quote, backslash, brace,
        # delimiter or whitespace, is empty, or reads NULL; so this split is exact.
        if "{" in body or "}" in body or "\\" in body:
            raise ValueError("malformed array literal")
        parts = body.split(delimiter)
        if "" in parts:
            raise ValueError("malformed array literal")
        return [None if e == "NULL" else e for e in parts]
    return _parse_quoted(body, delimiter)


def _parse_quoted(body: str, delimiter: str) -> list[str | None]:
    rx = _ELEMENT_RE.get(delimiter)
    if rx is None:
        d = re.escape(delimiter)
        rx = _ELEMENT_RE[delimiter] = re.compile(
            rf'"((?:[^"\\]|\\.)*)"|([^"{{}}\\{d}]+)', re.DOTALL
        )
    out: list[str | None] = []
    pos, end = 0, len(body)
    while True:
        m = rx.match(body, pos)
        if m is None:
            raise ValueError("malformed array literal")
        quoted = m[1]
        if quoted is not None:
            out.append(_UNESCAPE.sub(r"\1", quoted) if "\\" in quoted else quoted)
        else:
            out.append(None if m[2] == "NULL" else m[2])
        pos = m.end()
        if pos == end:
            return out
        if body[pos] != delimiter:
            raise ValueError("malformed array literal")
        pos += 1


def _multidimensional() -> ValueError:
    return UnrepresentableValueError(
        "multi-dimensional arrays are not supported: an Iceberg list column has one "
        "fixed nesting depth",
        hint="publish the column as a one-dimensional array, or as text "
        "(e.g. a generated column) and leave this one out of the publication's column list",
    )


_CONVERTERS: dict[ColumnKind, Callable[[pa.Array, ColumnTarget], Any]] = {
    ColumnKind.INT: _cast_to(pa.int32()),
    ColumnKind.LONG: _cast_to(pa.int64()),
    ColumnKind.FLOAT: _cast_to(pa.float32()),
    ColumnKind.DOUBLE: _cast_to(pa.float64()),
    ColumnKind.DECIMAL: _decimal,
    ColumnKind.BOOLEAN: _boolean,
    ColumnKind.STRING: _string,
    ColumnKind.BINARY: _bytea,
    ColumnKind.DATE: _date,
    ColumnKind.TIME: _time,
    ColumnKind.TIMESTAMP: _timestamp,
    ColumnKind.TIMESTAMPTZ: _timestamp,
    ColumnKind.UUID: _uuid,
    ColumnKind.LIST: _list,
}
