"""The Arrow idioms every column converter uses: the null text, masks asked all/any,
a string array's character buffer, and putting nulls back after a kernel filled them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

NULL_TEXT = pa.scalar(None, pa.large_string())


def all_true(mask: pa.Array) -> bool:
    """True unless a non-null element is false (so also for an empty column)."""
    return pc.all(mask, min_count=0).as_py() is not False


def any_true(mask: pa.Array) -> bool:
    """True if a non-null element is true."""
    return pc.any(mask, min_count=0).as_py() is True


def char_buffer(arr: pa.Array) -> memoryview:
    """The characters of a large string array, value after value, without a copy."""
    _, offsets_buf, data_buf = arr.buffers()
    offsets = pa.Array.from_buffers(pa.int64(), len(arr) + 1, [None, offsets_buf], 0, arr.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    return memoryview(data_buf)[start:end] if data_buf is not None else memoryview(b"")


def restore_nulls(out: pa.Array, like: pa.Array) -> pa.Array:
    if not like.null_count:
        return out
    return pc.if_else(pc.is_valid(like), out, pa.scalar(None, out.type))
