"""Reading TupleData, the decoder's hot loop (see decoder.py, SPEED)."""

from __future__ import annotations

import struct
from itertools import repeat

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput._wire import (
    _I32,
    _U32,
    Buffer,
    _error,
    _Fields,
    _name,
    _new_tupledata,
    tag_name,
)
from sparkapply.pgoutput.messages import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED,
    UNCHANGED,
    ColumnValue,
    TupleData,
)

# ---------------------------------------------------------------------------------
# TupleData: the hot loop

# The loops below compare each column's kind byte with literals, for speed (a constant,
# no name lookup per column); they are messages.py's kinds, which this pins.
assert (KIND_TEXT, KIND_BINARY, KIND_NULL, KIND_UNCHANGED) == (0x74, 0x62, 0x6E, 0x75)


def _columns(buf: bytes, o: int, end: int, natts: int) -> tuple[TupleData, int]:
    """Read ``natts`` columns starting at ``o``; return the row and the offset after it."""
    kinds: list[int] = []
    add_kind = kinds.append
    values: list[ColumnValue] = []
    add = values.append
    u32 = _U32
    try:
        for _ in repeat(None, natts):
            k = buf[o]
            if k == 0x74 or k == 0x62:  # 't' / 'b': Int32 length, then the bytes
                # Read unsigned so that one compare catches both a negative length
                # (a huge unsigned one) and a value running past the end.
                e = o + 5 + u32(buf, o + 1)[0]
                if e > end:
                    raise _bad_length(buf, o, len(values))
                add(buf[o + 5 : e])
                o = e
            elif k == 0x6E:  # 'n': NULL, no value follows
                add(None)
                o += 1
            elif k == 0x75:  # 'u': unchanged TOAST, no value follows
                add(UNCHANGED)
                o += 1
            else:
                raise _bad_kind(buf, o, len(values))
            add_kind(k)
    except (IndexError, struct.error):
        raise _truncated_column(buf, o, len(values)) from None
    return _new_tupledata(bytes(kinds), tuple(values)), o


def _columns_view(buf: memoryview, o: int, end: int, natts: int) -> tuple[TupleData, int]:
    """``_columns`` for a large payload walked in place; copies each value out."""
    kinds: list[int] = []
    values: list[ColumnValue] = []
    try:
        for _ in repeat(None, natts):
            k = buf[o]
            if k == 0x74 or k == 0x62:
                e = o + 5 + _U32(buf, o + 1)[0]
                if e > end:
                    raise _bad_length(buf, o, len(values))
                values.append(buf[o + 5 : e].tobytes())
                o = e
            elif k == 0x6E:
                values.append(None)
                o += 1
            elif k == 0x75:
                values.append(UNCHANGED)
                o += 1
            else:
                raise _bad_kind(buf, o, len(values))
            kinds.append(k)
    except (IndexError, struct.error):
        raise _truncated_column(buf, o, len(values)) from None
    return _new_tupledata(bytes(kinds), tuple(values)), o


def _read_tuple(buf: Buffer, o: int, natts: int) -> tuple[TupleData, int]:
    if type(buf) is bytes:
        return _columns(buf, o, len(buf), natts)
    assert isinstance(buf, memoryview)
    return _columns_view(buf, o, len(buf), natts)


def _bad_length(buf: Buffer, o: int, column: int) -> ProtocolError:
    (n,) = _I32(buf, o + 1)
    if n < 0:
        return _error(
            buf, f"negative length {n} for column {column} in {_name(buf)} message", o + 1
        )
    left = len(buf) - (o + 5)
    return _error(
        buf,
        f"truncated {_name(buf)} message: column {column} value needs {n} bytes"
        f" at offset {o + 5}, {left} left",
        o + 5,
    )


def _bad_kind(buf: Buffer, o: int, column: int) -> ProtocolError:
    return _error(
        buf,
        f"bad column kind {tag_name(buf[o])} for column {column} in {_name(buf)} message"
        " (expected 'n', 'u', 't' or 'b')",
        o,
    )


def _truncated_column(buf: Buffer, o: int, column: int) -> ProtocolError:
    end = len(buf)
    if o >= end:
        return _error(
            buf,
            f"truncated {_name(buf)} message: column {column} kind needs 1 byte"
            f" at offset {o}, 0 left",
            o,
        )
    left = end - (o + 1)
    return _error(
        buf,
        f"truncated {_name(buf)} message: column {column} length needs 4 bytes"
        f" at offset {o + 1}, {left} left",
        o + 1,
    )


_NATTS = _Fields(("column count", "H"))


def _tuple_at(buf: Buffer, o: int, which: str) -> tuple[TupleData, int]:
    (natts,) = _NATTS.read(buf, o, which)
    return _read_tuple(buf, o + 2, natts)
