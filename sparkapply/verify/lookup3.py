"""PostgreSQL's 64-bit string hash, ``hashtextextended``, computed off the server.

``verify`` hashes each row's canonical text on both sides and compares the sums, so
the hash must be one PostgreSQL computes in SQL, and one the mirror's side computes
over tens of millions of rows in the time a scan takes. ``hashtextextended(text,
seed)`` is Bob Jenkins' lookup3 over the text's bytes (``hash_bytes_extended`` in
PostgreSQL's ``src/common/hashfn.c``; for a deterministic collation, the bytes as
stored): a fifth of MD5's cost over the same text, and its result is fixed,
since hash partitioning depends on it surviving ``pg_upgrade``. (On a big-endian
server it differs; verify checks the server's result against this one before it
trusts a sum, see ``publisher.py``.)

The hash is written once, as plain Python over integers masked to 32 bits: Python
runs it for one value (:func:`text_hash64`) and numba compiles the same functions
for a whole Arrow string array (:func:`array_hashes`), where a loop a row in Python
would take minutes.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from numba import njit
from numba.extending import register_jitable

_M = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9 + 3923095  # the initial state, before the length is added


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M


# lookup3's mix and final are each one step repeated with the roles of (a, b, c)
# turning: mix's is x -= z; x ^= rot(z, k); z += y, final's is z ^= y; z -= rot(y, k).
_MIX_ROTATIONS = (4, 6, 8, 16, 19, 4)
_FINAL_ROTATIONS = (14, 11, 25, 16, 4, 14, 24)


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    for k in _MIX_ROTATIONS:  # six steps: the roles turn back to (a, b, c)
        a = ((a - c) & _M) ^ _rot(c, k)
        c = (c + b) & _M
        a, b, c = b, c, a
    return a, b, c


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    for k in _FINAL_ROTATIONS:
        c = ((c ^ b) - _rot(b, k)) & _M
        a, b, c = b, c, a
    return c, a, b  # seven steps: the roles have turned once


def _tail(data: Any, k: int, n: int, shift: int) -> int:
    """Up to 4 bytes from ``data[k]`` on, little-endian, the first at ``shift``."""
    word = 0
    for i in range(min(n, 4)):
        word |= int(data[k + i]) << (8 * i + shift)
    return word & _M


def _hash(data: Any, start: int, length: int) -> tuple[int, int]:
    """The ``(b, c)`` halves of ``hash_bytes_extended(data[start:start + length], 0)``
    on a little-endian server: the result is ``b << 32 | c``."""
    a = b = c = (_GOLDEN + length) & _M
    k = start
    left = length
    while left >= 12:
        a = (a + _tail(data, k, 4, 0)) & _M
        b = (b + _tail(data, k + 4, 4, 0)) & _M
        c = (c + _tail(data, k + 8, 4, 0)) & _M
        a, b, c = _mix(a, b, c)
        k += 12
        left -= 12
    # The last 0-11 bytes; c's lowest byte is left for the length, as in lookup3.
    if left > 8:
        c = (c + _tail(data, k + 8, left - 8, 8)) & _M
    if left > 4:
        b = (b + _tail(data, k + 4, left - 4, 0)) & _M
    if left > 0:
        a = (a + _tail(data, k, left, 0)) & _M
    a, b, c = _final(a, b, c)
    return b, c


def _rows(offsets: Any, data: Any, out: Any) -> None:
    for i in range(len(offsets) - 1):
        start = offsets[i]
        b, c = _hash(data, start, offsets[i + 1] - start)
        out[i] = (np.uint64(b) << np.uint64(32)) | np.uint64(c)


for _helper in (_rot, _mix, _final, _tail, _hash):
    register_jitable(_helper)
# Compiled at the first call of a process (0.6 s), cached on disk for the next ones
# (0.1 s): beside this file, else in the user's cache directory. Where neither is
# writable (a read-only install, no home), numba refuses to cache: compile each time.
try:
    _compiled_rows = njit(cache=True, nogil=True)(_rows)
except RuntimeError:
    _compiled_rows = njit(nogil=True)(_rows)


def text_hash64(data: bytes) -> int:
    """``hashtextextended`` of ``data`` (a text's bytes) with seed 0, as PostgreSQL
    returns it: a signed 64-bit integer."""
    b, c = _hash(data, 0, len(data))
    unsigned = (b << 32) | c
    return unsigned - (1 << 64) if unsigned >> 63 else unsigned


def array_hashes(texts: pa.Array) -> npt.NDArray[np.uint64]:
    """:func:`text_hash64` of every value of a string array (nulls hash as the empty
    text), unsigned."""
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        raise TypeError(f"array_hashes needs a string array, not {texts.type}")
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    _, offsets_buf, data_buf = texts.buffers()
    out = np.empty(len(texts), dtype=np.uint64)
    if len(texts) == 0:
        return out
    offsets = np.frombuffer(offsets_buf, dtype=width)[texts.offset : texts.offset + len(texts) + 1]
    data = np.frombuffer(data_buf if data_buf is not None else b"\0", dtype=np.uint8)
    _compiled_rows(offsets, data, out)
    return cast(npt.NDArray[np.uint64], out)
