"""Canonical row keys: typed Arrow columns → one comparable binary value per row.

The fold keys rows by PostgreSQL text; the table holds typed values. Both sides are
brought to typed Arrow first and then through this one function, so equal values get
equal keys whatever their text spelling.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

_SEP = b"\x1f"
_NULL = b"\x00"


def _as_binary(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if isinstance(t, pa.ExtensionType):
        arr = arr.storage
        t = arr.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        out = pc.cast(arr, pa.binary())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        out = pc.cast(pc.cast(arr, pa.string()), pa.binary())
    elif pa.types.is_nested(t):
        out = pa.array(
            [None if v is None else repr(v).encode() for v in arr.to_pylist()], pa.binary()
        )
    else:
        out = pc.cast(pc.cast(arr, pa.string()), pa.binary())
    return pc.fill_null(out, pa.scalar(_NULL, pa.binary()))


def canonical_keys(columns: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """One binary value per row, equal iff all the columns' values are equal."""
    parts = [_as_binary(c) for c in columns]
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, _SEP)
