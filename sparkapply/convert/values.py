"""Columns of PostgreSQL text values to Arrow arrays; runs inside Spark executors.

This module owns the value conversion: one column of text-format values (the bytes
pgoutput sent, ``None`` for NULL) in, one Arrow array of the column's target type (see
:mod:`sparkapply.convert.types`) out. It gathers the column, picks the converter of its
kind and finds the bad value when one fails; the converters live by what they convert:
:mod:`~sparkapply.convert.scalars` (numbers, booleans, strings, bytea, uuid),
:mod:`~sparkapply.convert.temporal` (dates, times, timestamps) and
:mod:`~sparkapply.convert.arrays` (array literals, whose elements convert as one column
of the element's kind). All of them import only pyarrow and the standard library.

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

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.convert import scalars, temporal
from sparkapply.convert.arrays import split_literals
from sparkapply.convert.types import (
    ColumnKind,
    ColumnTarget,
    PgColumnType,
    column_target,
    pg_type_name,
)
from sparkapply.errors import ConversionError

ColumnValues: TypeAlias = Sequence[bytes | None] | pa.Array | pa.ChunkedArray
"""One column: the text-format values (``None`` = NULL), or an Arrow (large) binary or
string array of them."""

_MAX_SHOWN = 80  # characters of an offending value shown in an error


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


def _show(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="backslashreplace")
    text = str(value)
    if len(text) > _MAX_SHOWN:
        text = text[:_MAX_SHOWN] + "..."
    return repr(text)


# --------------------------------------------------------------------------------
# Dispatch: each kind's converter, lists through their element's
# --------------------------------------------------------------------------------


def _list(text: pa.Array, target: ColumnTarget) -> pa.Array:
    element = target.element
    assert element is not None
    offsets, elements = split_literals(text, target.delimiter)
    # The elements of the whole column convert as one vectorised column.
    values = _CONVERTERS[element.kind](elements, element)
    mask = pc.is_null(text) if text.null_count else None
    return pa.LargeListArray.from_arrays(offsets, values, type=target.arrow_type, mask=mask)


_CONVERTERS: dict[ColumnKind, Callable[[pa.Array, ColumnTarget], Any]] = {
    ColumnKind.INT: scalars.cast_to(pa.int32()),
    ColumnKind.LONG: scalars.cast_to(pa.int64()),
    ColumnKind.FLOAT: scalars.cast_to(pa.float32()),
    ColumnKind.DOUBLE: scalars.cast_to(pa.float64()),
    ColumnKind.DECIMAL: scalars.decimal,
    ColumnKind.BOOLEAN: scalars.boolean,
    ColumnKind.STRING: scalars.string,
    ColumnKind.BINARY: scalars.bytea,
    ColumnKind.DATE: temporal.date,
    ColumnKind.TIME: temporal.time,
    ColumnKind.TIMESTAMP: temporal.timestamp,
    ColumnKind.TIMESTAMPTZ: temporal.timestamp,
    ColumnKind.UUID: scalars.uuid,
    ColumnKind.LIST: _list,
}
