"""Cheap routing reads of change messages: tag, in-stream xid and relation ids.

The driver must know which transaction and relation a change belongs to, but not its
column values: those are decoded once, on an executor. Full validation of the change
happens there; here only the fixed-offset header is read (and checked for length).

The assembler's receive loop reads BEGIN, COMMIT and change headers inline, with no
call per message (``changes/assembler.py``, ``feed_frames``); the layouts it reads
them by are defined here, beside :func:`peek_change`.
"""

from __future__ import annotations

import struct

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput.messages import TAG_DELETE, TAG_INSERT, TAG_UPDATE

_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")

# Layouts for inline reads (offsets after the tag byte unless said otherwise).
U32 = _U32
BEGIN_SIZE = 21  # tag, final LSN, commit time, xid
BEGIN_XID_AT = 17  # from the tag
COMMIT_SIZE = 26  # tag, flags, commit LSN, end LSN, commit time
COMMIT = struct.Struct("!BQQq")  # flags, commit LSN, end LSN, commit time
CHANGE_HEAD = 8  # tag, relation id, tuple kind, column count
STREAM_CHANGE_HEAD = 12  # tag, xid, relation id, tuple kind, column count

CHANGE_TAGS = frozenset((TAG_INSERT, TAG_UPDATE, TAG_DELETE))


def peek_change(payload: bytes | memoryview, in_stream: bool) -> tuple[int, int | None, int]:
    """(tag, xid or None, relation id) of an Insert/Update/Delete payload."""
    need = 9 if in_stream else 5
    if len(payload) < need + 3:
        raise ProtocolError(
            f"change message too short ({len(payload)} bytes)",
            tag=chr(payload[0]) if payload else None,
            offset=len(payload),
        )
    if in_stream:
        return payload[0], _U32.unpack_from(payload, 1)[0], _U32.unpack_from(payload, 5)[0]
    return payload[0], None, _U32.unpack_from(payload, 1)[0]
