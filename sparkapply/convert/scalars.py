"""Numbers, booleans, strings, bytea and uuid: the columns whose text Arrow parses, or
that decode as one hex buffer; runs inside Spark executors.

Numbers, decimals and booleans are Arrow casts and comparisons. bytea and uuid are a
single ``binascii.a2b_hex`` over the whole character buffer, with new offsets computed
by kernels; only bytea in the ``escape`` output format goes one value at a time.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.convert.kernels import NULL_TEXT, all_true, any_true, char_buffer, restore_nulls
from sparkapply.convert.types import ColumnTarget


def cast_to(arrow_type: pa.DataType) -> Callable[[pa.Array, ColumnTarget], pa.Array]:
    # int2/int4/int8/oid and float4/float8: Arrow's parsers accept every form PostgreSQL
    # prints, including NaN, Infinity and -Infinity; float4 parses straight to float32,
    # so a shortest-exact float4 text reproduces the same bits.
    def convert(text: pa.Array, target: ColumnTarget) -> pa.Array:
        return pc.cast(text, arrow_type)

    return convert


def decimal(text: pa.Array, target: ColumnTarget) -> pa.Array:
    # Arrow parses decimal text exactly (no float round-trip) and refuses to drop
    # digits, so an out-of-range value fails instead of rounding.
    arrow_type = target.arrow_type
    try:
        return pc.cast(text, arrow_type)
    except pa.ArrowInvalid:
        nan = pc.equal(text, "NaN")
        if not any_true(nan):
            raise
    # A decimal has no NaN: it becomes null (documented in types.py).
    return pc.cast(pc.if_else(nan, NULL_TEXT, text), arrow_type)


def boolean(text: pa.Array, target: ColumnTarget) -> pa.Array:
    is_true = pc.equal(text, "t")
    if not all_true(pc.or_(is_true, pc.equal(text, "f"))):
        raise ValueError("a boolean is 't' or 'f'")
    return is_true


def string(text: pa.Array, target: ColumnTarget) -> pa.Array:
    return text


def bytea(text: pa.Array, target: ColumnTarget) -> pa.Array:
    filled = text.fill_null("\\x") if text.null_count else text
    if not all_true(pc.starts_with(filled, "\\x")):
        return _bytea_per_value(text)  # bytea_output = escape
    chars = bytes(char_buffer(filled))
    # Hex digits contain no backslash, so the only ones are the n '\x' prefixes and
    # dropping every '\x' from the buffer leaves exactly the digits, value after value.
    if chars.count(b"\\") != len(filled):
        raise ValueError("a hex bytea is '\\x' followed by hex digits")
    digit_counts = pc.subtract(pc.binary_length(filled), 2)
    if any_true(pc.not_equal(pc.bit_wise_and(digit_counts, 1), 0)):
        raise ValueError("a hex bytea has an even number of digits")
    decoded = binascii.a2b_hex(chars.replace(b"\\x", b""))
    offsets = pa.concat_arrays(
        [pa.array([0], pa.int64()), pc.cumulative_sum(pc.shift_right(digit_counts, 1))]
    )
    out = pa.Array.from_buffers(
        pa.large_binary(), len(filled), [None, offsets.buffers()[1], pa.py_buffer(decoded)]
    )
    return restore_nulls(out, text)


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


def uuid(text: pa.Array, target: ColumnTarget) -> pa.Array:
    filled = text.fill_null(_ZERO_UUID) if text.null_count else text
    if not all_true(pc.equal(pc.binary_length(filled), 36)):
        raise ValueError("a uuid has 36 characters")
    digits = pc.replace_substring(filled, "-", "")
    if not all_true(pc.equal(pc.binary_length(digits), 32)):
        raise ValueError("a uuid is 32 hex digits in 8-4-4-4-12 groups")
    storage = pa.Array.from_buffers(
        pa.binary(16), len(text), [None, pa.py_buffer(binascii.a2b_hex(char_buffer(digits)))]
    )
    return pa.ExtensionArray.from_storage(pa.uuid(), restore_nulls(storage, text))
