"""Row keys: typed Arrow key columns made comparable, and one binary value per row.

The fold keys rows by PostgreSQL text; the table holds typed values. Both sides are
brought to typed Arrow first and then through these functions, so equal values get
equal keys whatever their text spelling. The key partitions (``partition.py``) hash
and link keys by the same values; the folds and the writer (``apply/``) compare,
sort and match them.

Arrow's compute kernels (sort, equality, ``is_in``, joins) have no kernels for
extension types such as ``arrow.uuid``; :func:`comparable` gives every key column as
its storage (a uuid is its 16 big-endian bytes, which sort as uuids do), so each key
type PostgreSQL allows in a primary key sorts, compares and joins the same way.

Floating-point keys compare as PostgreSQL's ``=`` does, not as Arrow's kernels do
(bit patterns): ``-0`` equals ``0`` and every NaN equals every other, so a key updated
from ``-0`` to ``0`` names the same row, as it does on the publisher. The values
written are never these: a row keeps the text it arrived with.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SEP = b"\x1f"
_NULL = b"\x00"


def comparable(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``arr`` as one array that Arrow can sort, compare and join on (see above)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr.type, pa.BaseExtensionType):
        return arr.storage
    if pa.types.is_floating(arr.type):
        return _float_equality(arr)
    return arr


def as_int64(arr: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """A signed integer column without nulls as int64 values; None for any other.
    Such a key takes the NumPy paths (locating a batch's keys, a file's sorted key, the
    staged pieces' composition); every other key, Arrow's kernels on :func:`comparable`
    values."""
    if not pa.types.is_signed_integer(arr.type) or arr.null_count:
        return None
    values: np.ndarray = arr.to_numpy().astype(np.int64, copy=False)
    return values


def ascending(values: np.ndarray) -> np.ndarray:
    """``values`` sorted: the array itself when it is already. NumPy's sort does not
    notice sorted input (500,000 int64 in order: 38 ms, a check 0.8 ms), and the
    arrays these paths sort mostly are: a million-row update's removes, the rows a
    file's sorted key finds, the positions a delete file is written with (three sorts
    of half a million, in each of its composition tasks)."""
    if len(values) < 2 or bool(np.all(values[1:] >= values[:-1])):
        return values
    return np.sort(values)


def _float_equality(arr: pa.Array) -> pa.Array:
    """``arr`` with -0 as 0 and one NaN: equal as PostgreSQL's float equality says."""
    zeroed = pc.add(arr, pa.scalar(0.0, arr.type))  # IEEE: -0 + 0 is +0
    nan = pa.scalar(float("nan"), arr.type)
    return pc.if_else(pc.is_nan(zeroed), nan, zeroed)


def _as_binary(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = comparable(arr)
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
