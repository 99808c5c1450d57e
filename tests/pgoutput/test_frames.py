"""Walsender CopyData frames: parsing, encoding, and what is refused."""

from __future__ import annotations

import contextlib
import struct
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import (
    Decoder,
    PrimaryKeepalive,
    StandbyStatusUpdate,
    XLogData,
    encode,
    parse_copy_data,
    pg_now_micros,
)
from sparkapply.pgoutput import messages as m
from tests.pgoutput import strategies as s

SETTINGS = settings(max_examples=300, deadline=None)


def test_xlogdata_bytes() -> None:
    payload = encode(m.Insert(None, 1, m.TupleData(b"t", (b"x",))))
    frame = b"w" + struct.pack(">QQq", 0x16_B374D848, 0x16_B374D900, -1) + payload
    got = parse_copy_data(frame)
    assert got == XLogData(0x16_B374D848, 0x16_B374D900, -1, payload)
    assert isinstance(got, XLogData)
    assert got.encode() == frame
    assert Decoder().decode(got.payload) == m.Insert(None, 1, m.TupleData(b"t", (b"x",)))


def test_xlogdata_payload_is_a_view_into_the_frame() -> None:
    frame = bytearray(XLogData(1, 2, 3, b"abc").encode())
    got = parse_copy_data(memoryview(frame))
    assert isinstance(got, XLogData) and isinstance(got.payload, memoryview)
    frame[-1] = ord("z")
    assert bytes(got.payload) == b"abz"


def test_keepalive_bytes() -> None:
    frame = b"k" + struct.pack(">Qq", 0x10, 700) + b"\x01"
    got = parse_copy_data(frame)
    assert got == PrimaryKeepalive(0x10, 700, True)
    assert got.encode() == frame
    assert parse_copy_data(frame[:-1] + b"\x00") == PrimaryKeepalive(0x10, 700, False)


def test_standby_status_update_bytes() -> None:
    upd = StandbyStatusUpdate(3, 2, 1, 99, True)
    wire = upd.encode()
    assert wire == b"r" + struct.pack(">QQQq", 3, 2, 1, 99) + b"\x01"
    assert len(wire) == 34
    assert StandbyStatusUpdate.parse(wire) == upd
    assert StandbyStatusUpdate(3, 2, 1, 99).reply_requested is False


@SETTINGS
@given(s.lsns, s.lsns, s.times, st.binary(max_size=40))
def test_xlogdata_roundtrip(start: int, end: int, at: int, payload: bytes) -> None:
    frame = XLogData(start, end, at, payload).encode()
    for buf in (frame, bytearray(frame), memoryview(frame)):
        assert parse_copy_data(buf) == XLogData(start, end, at, payload)


@SETTINGS
@given(s.lsns, s.times, st.booleans())
def test_keepalive_roundtrip(end: int, at: int, reply: bool) -> None:
    assert parse_copy_data(PrimaryKeepalive(end, at, reply).encode()) == PrimaryKeepalive(
        end, at, reply
    )


@SETTINGS
@given(s.lsns, s.lsns, s.lsns, s.times, st.booleans())
def test_standby_status_roundtrip(w: int, f: int, a: int, at: int, reply: bool) -> None:
    upd = StandbyStatusUpdate(w, f, a, at, reply)
    assert StandbyStatusUpdate.parse(upd.encode()) == upd


@pytest.mark.parametrize(
    ("frame", "tag", "offset", "text"),
    [
        (b"", None, 0, "empty CopyData message"),
        (b"x", "x", 0, "unknown CopyData message"),
        (b"\x00abc", "0x00", 0, "unknown CopyData message"),
        (b"r" + bytes(33), "r", 0, "unknown CopyData message"),  # ours, not the server's
        (b"w" + bytes(23), "w", 24, "truncated XLogData message: needs 25 bytes, got 24"),
        (b"k" + bytes(16), "k", 17, "truncated Primary Keepalive message"),
        (b"k" + bytes(18), "k", 18, "1 trailing bytes after Primary Keepalive message"),
        (b"k" + bytes(16) + b"\x02", "k", 17, "bad reply flag 2"),
    ],
)
def test_malformed_frames(frame: bytes, tag: str | None, offset: int, text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_copy_data(frame)
    assert (info.value.tag, info.value.offset) == (tag, offset)
    assert text in info.value.message


def test_malformed_standby_status_update() -> None:
    with pytest.raises(ProtocolError, match="expected a 'r' CopyData message"):
        StandbyStatusUpdate.parse(b"k" + bytes(33))
    with pytest.raises(ProtocolError, match="expected a 'r' CopyData message"):
        StandbyStatusUpdate.parse(b"")
    with pytest.raises(ProtocolError, match="truncated Standby Status Update"):
        StandbyStatusUpdate.parse(b"r" + bytes(32))
    with pytest.raises(ProtocolError, match="bad reply flag 9"):
        StandbyStatusUpdate.parse(b"r" + bytes(32) + b"\x09")


@SETTINGS
@given(st.binary(max_size=40))
def test_random_frames_parse_or_raise_protocol_error(frame: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        parse_copy_data(frame)


def test_pg_now_micros() -> None:
    pg_epoch = datetime(2000, 1, 1, tzinfo=UTC)
    before = int((datetime.now(UTC) - pg_epoch).total_seconds() * 1_000_000)
    now = pg_now_micros()
    after = int((datetime.now(UTC) - pg_epoch).total_seconds() * 1_000_000)
    assert before - 1000 <= now <= after + 1000
    assert abs(now - (time.time() - 946_684_800) * 1_000_000) < 1_000_000


def test_frames_are_frozen() -> None:
    ka = PrimaryKeepalive(1, 2, False)
    with pytest.raises(AttributeError):
        ka.wal_end = 5  # type: ignore[misc]  # frozen: the assignment must fail
