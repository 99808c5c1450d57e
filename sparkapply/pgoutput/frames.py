"""Walsender CopyData framing: XLogData and keepalives in, standby status updates out."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput._wire import tag_name

__all__ = [
    "PG_EPOCH_OFFSET_MICROS",
    "XLOG_DATA_HEADER",
    "XLOG_DATA_TAG",
    "XLOG_WAL_START",
    "PrimaryKeepalive",
    "StandbyStatusUpdate",
    "XLogData",
    "parse_copy_data",
    "pg_now_micros",
]

# Inside COPY BOTH the walsender wraps each pgoutput message in XLogData ('w') and sends
# Primary Keepalive ('k'); the client answers with Standby Status Update ('r'). LSNs
# are unsigned, times signed microseconds since the PostgreSQL epoch.

# Microseconds from the Unix epoch to the PostgreSQL epoch (2000-01-01 UTC).
PG_EPOCH_OFFSET_MICROS = 946_684_800_000_000

XLOG_DATA_HEADER = struct.Struct(">cQQq")
XLOG_WAL_START = struct.Struct(">Q")  # an XLogData frame's wal_start, after its tag byte
"""XLogData's head: 'w', wal_start, wal_end, send_time (the receive loop reads it inline)."""
XLOG_DATA_TAG = ord("w")
_KEEPALIVE = struct.Struct(">cQqB")
_STATUS = struct.Struct(">cQQQqB")


def pg_now_micros() -> int:
    """Now, in microseconds since 2000-01-01 UTC (the protocol's send_time)."""
    return time.time_ns() // 1000 - PG_EPOCH_OFFSET_MICROS


@dataclass(frozen=True, slots=True)
class XLogData:
    """A chunk of WAL data; for logical replication one pgoutput message.

    ``payload`` is a zero-copy view into the frame when parsed; it stays valid as long
    as the frame's buffer is not reused.
    """

    wal_start: int
    wal_end: int
    send_time: int
    payload: memoryview | bytes

    def encode(self) -> bytes:
        return XLOG_DATA_HEADER.pack(b"w", self.wal_start, self.wal_end, self.send_time) + bytes(
            self.payload
        )


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    wal_end: int
    send_time: int
    reply_requested: bool

    def encode(self) -> bytes:
        return _KEEPALIVE.pack(b"k", self.wal_end, self.send_time, int(self.reply_requested))


@dataclass(frozen=True, slots=True)
class StandbyStatusUpdate:
    """The client's feedback: what is written, flushed (durable) and applied."""

    write_lsn: int
    flush_lsn: int
    apply_lsn: int
    send_time: int
    reply_requested: bool = False

    def encode(self) -> bytes:
        return _STATUS.pack(
            b"r",
            self.write_lsn,
            self.flush_lsn,
            self.apply_lsn,
            self.send_time,
            int(self.reply_requested),
        )

    @classmethod
    def parse(cls, buf: bytes | bytearray | memoryview) -> StandbyStatusUpdate:
        """Read a Standby Status Update (for a fake walsender in tests)."""
        view = _view(buf)
        _expect_tag(view, b"r")
        _, write, flush, apply, send_time, reply = _unpack(_STATUS, view, "Standby Status Update")
        return cls(write, flush, apply, send_time, _reply_flag(view, reply, _STATUS.size - 1))


def parse_copy_data(buf: bytes | bytearray | memoryview) -> XLogData | PrimaryKeepalive:
    """Parse one CopyData message from the walsender; ProtocolError if malformed."""
    view = _view(buf)
    if not view:
        raise ProtocolError("empty CopyData message", offset=0)
    tag = view[0]
    if tag == XLOG_DATA_TAG:
        _, wal_start, wal_end, send_time = _unpack(XLOG_DATA_HEADER, view, "XLogData", exact=False)
        return XLogData(wal_start, wal_end, send_time, view[XLOG_DATA_HEADER.size :])
    if tag == 0x6B:  # 'k'
        _, wal_end, send_time, reply = _unpack(_KEEPALIVE, view, "Primary Keepalive")
        return PrimaryKeepalive(wal_end, send_time, _reply_flag(view, reply, _KEEPALIVE.size - 1))
    raise ProtocolError(
        "unknown CopyData message (expected XLogData 'w' or Primary Keepalive 'k')",
        tag=tag_name(tag),
        offset=0,
    )


def _view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _expect_tag(view: memoryview, tag: bytes) -> None:
    if not view or view[0] != tag[0]:
        got = tag_name(view[0]) if view else None
        raise ProtocolError(f"expected a {tag.decode()!r} CopyData message", tag=got, offset=0)


def _unpack(
    st: struct.Struct, view: memoryview, name: str, *, exact: bool = True
) -> tuple[int, ...]:
    """Unpack a fixed-size frame, or with ``exact=False`` the fixed head of one."""
    tag = tag_name(view[0])
    if len(view) < st.size:
        raise ProtocolError(
            f"truncated {name} message: needs {st.size} bytes, got {len(view)}",
            tag=tag,
            offset=len(view),
        )
    if exact and len(view) > st.size:
        raise ProtocolError(
            f"{len(view) - st.size} trailing bytes after {name} message", tag=tag, offset=st.size
        )
    return st.unpack_from(view)


def _reply_flag(view: memoryview, value: int, offset: int) -> bool:
    if value > 1:
        raise ProtocolError(
            f"bad reply flag {value} (expected 0 or 1)", tag=tag_name(view[0]), offset=offset
        )
    return value == 1
