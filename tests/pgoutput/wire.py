"""pgoutput wire bytes built field by field from the protocol documentation (not with
the encoder), for the decoder tests."""

from __future__ import annotations

import struct
from collections.abc import Callable

from sparkapply.pgoutput import messages as m

# Big-endian integers of each width, as the protocol documentation names them.
u8: Callable[[int], bytes] = struct.Struct(">B").pack
u16: Callable[[int], bytes] = struct.Struct(">H").pack
u32: Callable[[int], bytes] = struct.Struct(">I").pack
i32: Callable[[int], bytes] = struct.Struct(">i").pack
u64: Callable[[int], bytes] = struct.Struct(">Q").pack
i64: Callable[[int], bytes] = struct.Struct(">q").pack


def cstr(s: str) -> bytes:
    return s.encode() + b"\x00"


def tup(*cols: bytes | None, kinds: bytes | None = None) -> tuple[bytes, m.TupleData]:
    """Wire bytes and value of a TupleData; None is NULL unless ``kinds`` says 'u'
    (then the value is UNCHANGED, distinct from NULL)."""
    kinds = kinds or bytes(b"n"[0] if c is None else b"t"[0] for c in cols)
    out = u16(len(cols))
    for k, c in zip(kinds, cols, strict=True):
        out += bytes((k,))
        if c is not None:
            out += i32(len(c)) + c
    values = tuple(
        m.UNCHANGED if k == m.KIND_UNCHANGED else c for k, c in zip(kinds, cols, strict=True)
    )
    return out, m.TupleData(kinds, values)


LSN1, LSN2, LSN3 = 0x16_B374D848, 0x16_B374D900, 0x17_00000000
T1, T2 = 780_000_000_000_000, -5  # times are signed
XID, SUBXID = 0xFFFF_FFF0, 1234  # xids are unsigned

ROW_WIRE, ROW = tup(b"1", None, b"\x00\xff", kinds=b"tnb")
KEY_WIRE, KEY = tup(b"1")
TOAST_WIRE, TOAST = tup(b"2", None, kinds=b"tu")
EMPTY_WIRE, EMPTY = tup()

# (wire bytes, message, in_stream); all decoded with protocol 4, streaming parallel.

INS = b"I" + u32(7) + b"N"  # the Insert head; the tuple follows at offset 6
BEGIN = b"B" + u64(LSN1) + i64(T1) + u32(XID)
