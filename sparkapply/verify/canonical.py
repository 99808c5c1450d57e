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

A row is its values joined by \\x1f, null as \\x1e; its hash PostgreSQL's
``hashtextextended`` of that text with seed 0, a signed 64-bit integer (``lookup3.py``:
not cryptographic, and a fifth of MD5's cost over the same text); its bucket the
hash's low 32 bits, unsigned, modulo the number of buckets; a table's hash the sum of
its rows' (mod 2^64): independent of order, counting duplicates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from sparkapply.convert.temporal import DATE_MAX, DATE_MIN, TIMESTAMP_MAX, TIMESTAMP_MIN
from sparkapply.convert.types import ColumnKind, ColumnTarget
from sparkapply.verify.lookup3 import array_hashes, text_hash64

FIELD_SEP = "\x1f"
NULL = "\x1e"
ELEMENT_SEP = "\x1d"
HASH_MOD = 1 << 64
_LOW32 = 0xFFFFFFFF
_TIME_MAX = 86_400_000_000 - 1


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


def _null_stays_null(template: str) -> str:
    return f"CASE WHEN {{c}} IS NULL THEN NULL ELSE {template} END"


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
    # Clamped as the mirror clamps (below), null kept: GREATEST and LEAST skip nulls,
    # and would make a null the clamp's bound.
    ColumnKind.DATE: _null_stays_null(
        "(least(greatest({c}, '0001-01-01'::date), '9999-12-31'::date) - '1970-01-01'::date)::text"
    ),
    ColumnKind.TIME: _null_stays_null(
        f"least((extract(epoch FROM {{c}}) * 1000000)::bigint, {_TIME_MAX})::text"
    ),
    ColumnKind.TIMESTAMP: _null_stays_null(
        "(extract(epoch FROM least(greatest({c}, '0001-01-01 00:00:00'::timestamp),"
        " '9999-12-31 23:59:59.999999'::timestamp)) * 1000000)::bigint::text"
    ),
    ColumnKind.TIMESTAMPTZ: _null_stays_null(
        "(extract(epoch FROM least(greatest({c}, '0001-01-01 00:00:00+00'::timestamptz),"
        " '9999-12-31 23:59:59.999999+00'::timestamptz)) * 1000000)::bigint::text"
    ),
    ColumnKind.UUID: "{c}::text",
}


# A function takes at most 100 arguments (FUNC_MAX_ARGS): concat_ws the separator and
# 99 texts. A wider row is joined in groups of 99, and the groups joined alike: no
# part is null, so the text is the same as one concat_ws of them all.
_CONCAT_MAX_TEXTS = 99


def sql_row_text(texts: Sequence[sql.Composable]) -> sql.Composable:
    """A row's text from its columns' canonical texts."""
    parts: list[sql.Composable] = [sql.SQL("coalesce({}, chr(30))").format(t) for t in texts]
    while len(parts) > _CONCAT_MAX_TEXTS:
        parts = [
            _concat_ws(parts[i : i + _CONCAT_MAX_TEXTS])
            for i in range(0, len(parts), _CONCAT_MAX_TEXTS)
        ]
    return _concat_ws(parts)


def _concat_ws(parts: Sequence[sql.Composable]) -> sql.Composable:
    return sql.SQL("concat_ws(chr(31), {})").format(sql.SQL(", ").join(parts))


def sql_hash(text: sql.Composable, *, utf8: bool = True) -> sql.Composable:
    """The 64-bit hash of a row's text (a signed bigint). In the C collation: a
    nondeterministic one would hash a sort key, not the bytes.

    The mirror holds UTF-8 (replication converts to the client's encoding) and its
    side hashes UTF-8 bytes. A server whose encoding is not UTF-8 (``utf8`` False)
    hashes the same bytes: its text converted to UTF-8, then taken back as a text
    of those very bytes (from SQL_ASCII nothing is converted; a single-byte server
    encoding holds any byte, so nothing is refused either)."""
    if not utf8:
        text = sql.SQL(
            "pg_catalog.convert_from(pg_catalog.convert_to(({}), 'UTF8'), 'SQL_ASCII')"
        ).format(text)
    return sql.SQL('pg_catalog.hashtextextended(({}) COLLATE "C", 0)').format(text)


def sql_hash_bucket(hash_: sql.Composable, buckets: int) -> sql.Composable:
    """Which of ``buckets`` the row of a :func:`sql_hash` falls in: the hash's low 32
    bits (lookup3's best mixed word), unsigned, modulo ``buckets``."""
    return sql.SQL("(({} & 4294967295) % {})").format(hash_, sql.Literal(buckets))


def sql_bucket(text: sql.Composable, buckets: int, *, utf8: bool = True) -> sql.Composable:
    """Which of ``buckets`` a row's text falls in."""
    return sql_hash_bucket(sql_hash(text, utf8=utf8), buckets)


# -- Arrow --------------------------------------------------------------------------------
#
# Vectorised: a 10-million-row table is hashed in seconds, not minutes, so the Iceberg
# side costs about what a plain scan of the table does.

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_STRING = pa.string()


def arrow_texts(array: pa.Array | pa.ChunkedArray, target: ColumnTarget) -> pa.Array:
    """The canonical text of each value of ``array`` (an Iceberg column as read), as a
    string array; null stays null."""
    if isinstance(array, pa.ChunkedArray):
        # One chunk as it is: combining would copy it.
        chunks = array.chunks
        array = (
            chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks or [pa.nulls(0, array.type)])
        )
    kind = target.kind
    if kind is ColumnKind.LIST:
        assert target.element is not None
        return _list_texts(array, target.element)
    if kind in (ColumnKind.FLOAT, ColumnKind.DOUBLE):
        width = np.uint32 if kind is ColumnKind.FLOAT else np.uint64
        bits = np.asarray(array.fill_null(0)).view(width).astype(f">u{np.dtype(width).itemsize}")
        return _keep_nulls(array, _hex_fixed(bits.view(np.uint8), np.dtype(width).itemsize))
    if kind is ColumnKind.DATE:
        return _clamped_ints(pc.cast(array, pa.int32()), DATE_MIN, DATE_MAX)
    if kind in (ColumnKind.TIMESTAMP, ColumnKind.TIMESTAMPTZ):
        micros = pc.cast(pc.cast(array, pa.timestamp("us", tz=array.type.tz)), pa.int64())
        return _clamped_ints(micros, TIMESTAMP_MIN, TIMESTAMP_MAX)
    if kind is ColumnKind.TIME:
        micros = pc.cast(pc.cast(array, pa.time64("us")), pa.int64())
        return _clamped_ints(micros, 0, _TIME_MAX)
    if kind is ColumnKind.BOOLEAN:
        return pc.if_else(array, "t", "f")
    if kind is ColumnKind.DECIMAL:
        return _decimal_texts(array)
    if kind is ColumnKind.BINARY:
        return _keep_nulls(array, _hex_binary(array))
    if kind is ColumnKind.UUID:
        storage = array.storage if isinstance(array, pa.ExtensionArray) else array
        return _keep_nulls(array, _uuid_texts(storage))
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array  # a copy to cast large_string would cost more than its hash
    return pc.cast(array, _STRING)


def arrow_text(array: pa.Array | pa.ChunkedArray, target: ColumnTarget) -> list[str | None]:
    """:func:`arrow_texts` as Python strings."""
    texts: list[str | None] = arrow_texts(array, target).to_pylist()
    return texts


def arrow_row_texts(columns: Sequence[pa.Array]) -> pa.Array:
    """Each row's text from its columns' canonical texts (as :func:`sql_row_text`)."""
    filled = [pc.fill_null(pc.cast(c, _STRING), NULL) for c in columns]
    if len(filled) == 1:
        return filled[0]
    return pc.binary_join_element_wise(*filled, FIELD_SEP)


def arrow_hashes(
    columns: Sequence[pa.Array],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint32]]:
    """The hash (as :func:`text_hash`) of each row that ``columns`` (canonical texts,
    at least one) make, and its bucket before the modulo (as :func:`text_bucket`)."""
    hashes = array_hashes(arrow_row_texts(columns))
    return hashes.view(np.int64), (hashes & np.uint64(_LOW32)).astype(np.uint32)


def _clamped_ints(ints: pa.Array, low: int, high: int) -> pa.Array:
    """The decimal text of integers, clamped to [low, high] as the mirror clamps them
    (most columns need no clamping, and the check is cheaper than the clamp)."""
    least, most = pc.min_max(ints).values()
    if least.is_valid and (least.as_py() < low or most.as_py() > high):
        # skip_nulls=False: a null stays null (skipped, it would become the bound).
        low_ = pc.max_element_wise(ints, low, skip_nulls=False)
        ints = pc.min_element_wise(low_, high, skip_nulls=False)
    return pc.cast(ints, _STRING)


def _keep_nulls(array: pa.Array, texts: pa.Array) -> pa.Array:
    if array.null_count == 0:
        return texts
    return pc.if_else(array.is_valid(), texts, pa.scalar(None, _STRING))


def _strings(lengths_from: npt.NDArray[np.int64], data: npt.NDArray[np.uint8]) -> pa.Array:
    offsets = pa.py_buffer(lengths_from.astype(np.int32).tobytes())
    return pa.StringArray.from_buffers(len(lengths_from) - 1, offsets, pa.py_buffer(data.tobytes()))


def _hex_fixed(data: npt.NDArray[np.uint8], width: int) -> pa.Array:
    """Lowercase hex of consecutive ``width``-byte values."""
    chars = np.empty(len(data) * 2, dtype=np.uint8)
    chars[0::2] = _HEX[data >> 4]
    chars[1::2] = _HEX[data & 0x0F]
    n = len(data) // width if width else 0
    return _strings(np.arange(n + 1, dtype=np.int64) * (2 * width), chars)


def _hex_binary(array: pa.Array) -> pa.Array:
    """Lowercase hex of each value of a binary array (any slice of one)."""
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    _, offsets_buf, data_buf = array.buffers()
    at = array.offset
    offsets = np.frombuffer(offsets_buf, dtype=width)[at : at + len(array) + 1]
    if data_buf is None or len(offsets) == 0:
        return pa.array([""] * len(array), _STRING)
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]]
    chars = np.empty(len(data) * 2, dtype=np.uint8)
    chars[0::2] = _HEX[data >> 4]
    chars[1::2] = _HEX[data & 0x0F]
    return _strings((offsets.astype(np.int64) - offsets[0]) * 2, chars)


_UUID_DASHES = (8, 12, 16, 20)  # hex positions a dash goes before


def _uuid_texts(storage: pa.Array) -> pa.Array:
    raw = np.frombuffer(storage.buffers()[1], dtype=np.uint8)
    start = storage.offset * 16
    data = raw[start : start + len(storage) * 16].reshape(-1, 16)
    hexes = np.empty((len(storage), 32), dtype=np.uint8)
    hexes[:, 0::2] = _HEX[data >> 4]
    hexes[:, 1::2] = _HEX[data & 0x0F]
    dash = np.full((len(storage), 1), ord("-"), dtype=np.uint8)
    parts = np.split(hexes, _UUID_DASHES, axis=1)
    text = np.hstack([p for part in parts for p in (part, dash)][:-1]).reshape(-1)
    return _strings(np.arange(len(storage) + 1, dtype=np.int64) * 36, text)


def _decimal_texts(array: pa.Array) -> pa.Array:
    texts = pc.cast(array, _STRING)
    # Arrow writes some values (zero at a large scale, tiny ones) in E notation;
    # PostgreSQL never does. Those few are formatted one by one.
    odd = pc.match_substring(texts, "E")
    if not pc.any(odd).as_py():
        return texts
    fixed = [
        None if v is None else (format(v, "f") if "E" in t else t)
        for v, t in zip(array.to_pylist(), texts.to_pylist(), strict=True)
    ]
    return pa.array(fixed, _STRING)


def _list_texts(array: pa.Array, element: ColumnTarget) -> pa.Array:
    # The values the offsets span, not flatten(): that leaves out what backs a null
    # list, and the offsets would no longer match.
    start, end = array.offsets[0].as_py(), array.offsets[-1].as_py()
    inner = array.values.slice(start, end - start)
    values = pc.fill_null(pc.cast(arrow_texts(inner, element), _STRING), NULL)
    offsets = pc.subtract(array.offsets, start)
    lists_of = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
    lists = lists_of.from_arrays(offsets, values)
    joined = pc.binary_join(lists, ELEMENT_SEP)
    framed = pc.binary_join_element_wise("[", joined, "]", "")
    return _keep_nulls(array, framed)


def row_text(values: Sequence[str | None]) -> str:
    return FIELD_SEP.join(NULL if v is None else v for v in values)


def text_hash(text: str) -> int:
    """The signed 64-bit hash of a row's (or key's) text, as :func:`sql_hash`."""
    return text_hash64(text.encode())


def text_bucket(text: str, buckets: int) -> int:
    """As :func:`sql_bucket`."""
    return (text_hash(text) & _LOW32) % buckets
