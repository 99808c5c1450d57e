"""The canonical text of every mapped value, computed alike on both sides.

``verify`` hashes each row on the publisher (in SQL, on the server) and in Iceberg (in
Spark tasks, over Arrow) and compares the sums. The two sides agree only if every
value becomes the same text on both; this module is the one definition of that text,
as a SQL expression over a PostgreSQL column (:func:`sql_text`) and as a function over
an Arrow column (:func:`arrow_text`), per Iceberg column kind (``convert/types.py``).

The forms are chosen to be exact and cheap on both sides, not to be read:

- integers: decimal digits; bool: ``t``/``f``;
- float4/float8: the IEEE bytes, big-endian hex (``float4send``/``float8send``): no
  formatting rules to match, NaN, the infinities and -0 included;
- numeric(p,s): its text with s decimals; ``NaN`` is null (the documented mapping);
  wider numerics are strings in Iceberg, compared as PostgreSQL's text;
- date: days since 1970-01-01, time: microseconds since midnight, timestamp and
  timestamptz: microseconds since the epoch (UTC), each clamped to 0001-01-01 ..
  9999-12-31 23:59:59.999999 as the mirror clamps them (``24:00:00`` to 23:59:59.999999);
- bytea: lowercase hex; uuid: its canonical text;
- every other type (text, varchar, bpchar with its padding, json, jsonb, enums,
  interval, ...): the type's output function, as pgoutput sent it (the session's
  settings are the walsender's: ``source/connection.py``);
- arrays: ``[`` elements ``]``, elements in order, separated by \\x1d (the lower
  bound dropped, as the mirror drops it).

A row is its values joined by \\x1f, null as \\x1e; its hash the first 8 bytes of the
MD5 of that text as a signed 64-bit integer; a table's hash the sum of its rows'
(mod 2^64): independent of order, counting duplicates.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from sparkapply.convert.types import ColumnKind, ColumnTarget
from sparkapply.convert.values import DATE_MAX, DATE_MIN, TIMESTAMP_MAX, TIMESTAMP_MIN

FIELD_SEP = "\x1f"
NULL = "\x1e"
ELEMENT_SEP = "\x1d"
HASH_MOD = 1 << 64
_TIME_MAX = 86_400_000_000 - 1
_FLOAT4 = struct.Struct(">f")  # float4send's bytes
_FLOAT8 = struct.Struct(">d")


# -- PostgreSQL ---------------------------------------------------------------------------


def sql_text(column: sql.Composable, target: ColumnTarget) -> sql.Composable:
    """The canonical text of ``column`` (an expression) in SQL; null stays null."""
    kind = target.kind
    if kind is ColumnKind.LIST:
        assert target.element is not None
        element = sql_text(sql.SQL("u.e"), target.element)
        return sql.SQL(
            "CASE WHEN {c} IS NULL THEN NULL ELSE '[' || coalesce((SELECT string_agg("
            "coalesce({e}, chr(30)), chr(29) ORDER BY u.n) FROM unnest({c}) WITH ORDINALITY "
            "AS u(e, n)), '') || ']' END"
        ).format(c=column, e=element)
    template = _SQL[kind]
    return sql.SQL(template).format(c=column)


_SQL: dict[ColumnKind, str] = {
    ColumnKind.INT: "{c}::text",
    ColumnKind.LONG: "{c}::text",
    ColumnKind.FLOAT: "encode(float4send({c}), 'hex')",
    ColumnKind.DOUBLE: "encode(float8send({c}), 'hex')",
    ColumnKind.DECIMAL: "CASE WHEN {c} = 'NaN'::numeric THEN NULL ELSE {c}::text END",
    ColumnKind.BOOLEAN: "CASE WHEN {c} THEN 't' WHEN NOT {c} THEN 'f' END",
    # The type's output function (format's %s), not a cast: a cast to text drops
    # bpchar's padding, which pgoutput sends.
    ColumnKind.STRING: "CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END",
    ColumnKind.BINARY: "encode({c}, 'hex')",
    ColumnKind.DATE: (
        "(least(greatest({c}, '0001-01-01'::date), '9999-12-31'::date) - '1970-01-01'::date)::text"
    ),
    ColumnKind.TIME: f"least((extract(epoch FROM {{c}}) * 1000000)::bigint, {_TIME_MAX})::text",
    ColumnKind.TIMESTAMP: (
        "(extract(epoch FROM least(greatest({c}, '0001-01-01 00:00:00'::timestamp),"
        " '9999-12-31 23:59:59.999999'::timestamp)) * 1000000)::bigint::text"
    ),
    ColumnKind.TIMESTAMPTZ: (
        "(extract(epoch FROM least(greatest({c}, '0001-01-01 00:00:00+00'::timestamptz),"
        " '9999-12-31 23:59:59.999999+00'::timestamptz)) * 1000000)::bigint::text"
    ),
    ColumnKind.UUID: "{c}::text",
}


def sql_row_text(texts: Sequence[sql.Composable]) -> sql.Composable:
    """A row's text from its columns' canonical texts."""
    parts = sql.SQL(", ").join(sql.SQL("coalesce({}, chr(30))").format(t) for t in texts)
    return sql.SQL("concat_ws(chr(31), {})").format(parts)


def sql_hash(text: sql.Composable) -> sql.Composable:
    """The 64-bit hash of a row's text (a signed bigint)."""
    return sql.SQL("('x' || substr(md5({}), 1, 16))::bit(64)::bigint").format(text)


def sql_bucket(text: sql.Composable, buckets: int) -> sql.Composable:
    """Which of ``buckets`` a key's text falls in."""
    return sql.SQL("(('x' || substr(md5({}), 1, 8))::bit(32)::bigint % {})").format(
        text, sql.Literal(buckets)
    )


# -- Arrow --------------------------------------------------------------------------------


def arrow_text(array: pa.Array | pa.ChunkedArray, target: ColumnTarget) -> list[str | None]:
    """The canonical text of each value of ``array`` (an Iceberg column as read)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks else pa.array([], array.type)
    kind = target.kind
    if kind is ColumnKind.LIST:
        assert target.element is not None
        out: list[str | None] = []
        values = arrow_text(array.flatten(), target.element) if len(array) else []
        offsets = array.offsets.to_pylist()
        valid = array.is_valid().to_pylist()
        for i, ok in enumerate(valid):
            if not ok:
                out.append(None)
                continue
            items = values[offsets[i] - offsets[0] : offsets[i + 1] - offsets[0]]
            out.append("[" + ELEMENT_SEP.join(NULL if v is None else v for v in items) + "]")
        return out
    if kind in (ColumnKind.FLOAT, ColumnKind.DOUBLE):
        pack = _FLOAT4.pack if kind is ColumnKind.FLOAT else _FLOAT8.pack
        return [None if v is None else pack(v).hex() for v in array.to_pylist()]
    if kind is ColumnKind.DATE:
        days = pc.cast(array, pa.int32())
        return _ints(pc.min_element_wise(pc.max_element_wise(days, DATE_MIN), DATE_MAX))
    if kind in (ColumnKind.TIMESTAMP, ColumnKind.TIMESTAMPTZ):
        micros = pc.cast(pc.cast(array, pa.timestamp("us", tz=array.type.tz)), pa.int64())
        return _ints(pc.min_element_wise(pc.max_element_wise(micros, TIMESTAMP_MIN), TIMESTAMP_MAX))
    if kind is ColumnKind.TIME:
        micros = pc.cast(pc.cast(array, pa.time64("us")), pa.int64())
        return _ints(pc.min_element_wise(micros, _TIME_MAX))
    if kind in (ColumnKind.INT, ColumnKind.LONG):
        return _ints(array)
    if kind is ColumnKind.BOOLEAN:
        return [None if v is None else ("t" if v else "f") for v in array.to_pylist()]
    if kind is ColumnKind.DECIMAL:
        return [None if v is None else format(v, "f") for v in array.to_pylist()]
    if kind is ColumnKind.BINARY:
        return [None if v is None else v.hex() for v in array.to_pylist()]
    if kind is ColumnKind.UUID:
        storage = array.storage if isinstance(array, pa.ExtensionArray) else array
        return [None if v is None else str(uuid.UUID(bytes=v)) for v in storage.to_pylist()]
    return [None if v is None else str(v) for v in array.to_pylist()]


def _ints(array: pa.Array) -> list[str | None]:
    return [None if v is None else str(v) for v in array.to_pylist()]


def row_text(values: Sequence[str | None]) -> str:
    return FIELD_SEP.join(NULL if v is None else v for v in values)


def text_hash(text: str) -> int:
    """The signed 64-bit hash of a row's (or key's) text, as :func:`sql_hash`."""
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "big", signed=True)


def text_bucket(text: str, buckets: int) -> int:
    """As :func:`sql_bucket`."""
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:4], "big") % buckets
