"""The decoder against malformed bytes: every error names its tag and offset."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import Decoder
from tests.pgoutput.wire import (
    BEGIN,
    EMPTY_WIRE,
    INS,
    KEY_WIRE,
    cstr,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
)


@dataclass(frozen=True)
class Bad:
    id: str
    wire: bytes
    tag: str | None
    offset: int
    text: str
    in_stream: bool = False
    proto_version: int = 4
    streaming: str = "parallel"


BAD = [
    Bad("empty", b"", None, 0, "empty pgoutput message"),
    Bad("unknown printable tag", b"Z123", "Z", 0, "unknown pgoutput message tag Z"),
    Bad("unknown NUL tag", b"\x00", "0x00", 0, "unknown pgoutput message tag 0x00"),
    Bad("unknown high tag", b"\xff\x01", "0xff", 0, "unknown pgoutput message tag 0xff"),
    Bad("space tag", b" ", "0x20", 0, "unknown"),
    Bad("begin cut in final_lsn", BEGIN[:5], "B", 1, "final_lsn needs 8 bytes at offset 1, 4 left"),
    Bad("begin cut in xid", BEGIN[:-1], "B", 17, "xid needs 4 bytes at offset 17, 3 left"),
    Bad("begin trailing", BEGIN + b"\x00", "B", 21, "1 trailing bytes after Begin message"),
    Bad("commit flags", b"C" + u8(2) + u64(1) + u64(2) + i64(3), "C", 1, "unrecognized flags 2"),
    Bad("commit short", b"C", "C", 1, "flags needs 1 byte at offset 1, 0 left"),
    Bad("origin no NUL", b"O" + u64(1) + b"name", "O", 9, "missing NUL terminator for Origin name"),
    Bad(
        "origin bad UTF-8", b"O" + u64(1) + b"ab\xffc\x00", "O", 11, "invalid UTF-8 in Origin name"
    ),
    Bad("origin trailing", b"O" + u64(1) + b"a\x00b", "O", 11, "1 trailing bytes"),
    Bad("insert empty body", b"I", "I", 1, "relation_id needs 4 bytes at offset 1, 0 left"),
    Bad("insert no marker", b"I" + u32(7), "I", 5, "tuple marker needs 1 byte at offset 5"),
    Bad(
        "insert no column count",
        INS + b"\x00",
        "I",
        6,
        "column count needs 2 bytes at offset 6, 1 left",
    ),
    Bad(
        "insert wrong marker",
        b"I" + u32(7) + b"K" + EMPTY_WIRE,
        "I",
        5,
        "bad tuple marker K in Insert message (expected 'N')",
    ),
    Bad("bad column kind", INS + u16(2) + b"n" + b"x", "I", 9, "bad column kind x for column 1"),
    Bad(
        "bad column kind unprintable",
        INS + u16(1) + b"\x01",
        "I",
        8,
        "bad column kind 0x01 for column 0",
    ),
    Bad(
        "negative length", INS + u16(1) + b"t" + i32(-1), "I", 9, "negative length -1 for column 0"
    ),
    Bad(
        "negative length int min",
        INS + u16(1) + b"b" + i32(-(2**31)),
        "I",
        9,
        "negative length -2147483648",
    ),
    Bad(
        "value past end",
        INS + u16(1) + b"t" + i32(5) + b"abc",
        "I",
        13,
        "column 0 value needs 5 bytes at offset 13, 3 left",
    ),
    Bad(
        "column kind missing",
        INS + u16(2) + b"n",
        "I",
        9,
        "column 1 kind needs 1 byte at offset 9, 0 left",
    ),
    Bad(
        "column length cut",
        INS + u16(1) + b"t" + b"\x00\x00",
        "I",
        9,
        "column 0 length needs 4 bytes at offset 9, 2 left",
    ),
    Bad(
        "insert trailing", INS + EMPTY_WIRE + b"N", "I", 8, "1 trailing bytes after Insert message"
    ),
    Bad(
        "streamed insert cut in xid",
        b"I\x00\x00",
        "I",
        1,
        "xid needs 4 bytes at offset 1, 2 left",
        in_stream=True,
    ),
    Bad(
        "streamed insert cut in head",
        b"I" + u32(1) + u32(2),
        "I",
        9,
        "tuple marker needs 1 byte at offset 9",
        in_stream=True,
    ),
    Bad(
        "update bad first marker",
        b"U" + u32(7) + b"X",
        "U",
        5,
        "bad tuple marker X in Update message (expected 'K', 'O' or 'N')",
    ),
    Bad(
        "update K then O",
        b"U" + u32(7) + b"K" + KEY_WIRE + b"O" + KEY_WIRE,
        "U",
        14,
        "bad tuple marker O in Update message (expected 'N')",
    ),
    Bad(
        "update K without new",
        b"U" + u32(7) + b"K" + KEY_WIRE,
        "U",
        14,
        "new tuple marker needs 1 byte at offset 14, 0 left",
    ),
    Bad(
        "update new tuple cut",
        b"U" + u32(7) + b"N" + u16(3) + b"nn",
        "U",
        10,
        "column 2 kind needs 1 byte at offset 10",
    ),
    Bad(
        "update old count cut",
        b"U" + u32(7) + b"O" + b"\x00",
        "U",
        6,
        "old tuple column count needs 2 bytes at offset 6, 1 left",
    ),
    Bad("delete N marker", b"D" + u32(7) + b"N" + KEY_WIRE, "D", 5, "(expected 'K' or 'O')"),
    Bad(
        "delete trailing",
        b"D" + u32(7) + b"K" + KEY_WIRE + b"\x00",
        "D",
        14,
        "1 trailing bytes after Delete message",
    ),
    Bad(
        "truncate ids cut",
        b"T" + u32(3) + u8(0) + u32(1) + b"\x00\x00",
        "T",
        10,
        "relation id 1 of 3 needs 4 bytes at offset 10, 2 left",
    ),
    Bad(
        "truncate huge count",
        b"T" + u32(0xFFFF_FFFF) + u8(0),
        "T",
        6,
        "relation id 0 of 4294967295",
    ),
    Bad("truncate trailing", b"T" + u32(1) + u8(0) + u32(1) + b"\x00", "T", 10, "1 trailing bytes"),
    Bad(
        "relation bad replident",
        b"R" + u32(1) + cstr("") + cstr("t") + b"x" + u16(0),
        "R",
        8,
        "bad replica identity x",
    ),
    Bad(
        "relation column cut",
        b"R"
        + u32(1)
        + cstr("")
        + cstr("t")
        + b"d"
        + u16(2)
        + u8(1)
        + cstr("a")
        + u32(23)
        + i32(-1)
        + u8(0)
        + cstr("b")
        + u32(23),
        "R",
        29,
        "column 1 type_modifier needs 4 bytes at offset 29, 0 left",
    ),
    Bad(
        "relation column name no NUL",
        b"R" + u32(1) + cstr("") + cstr("t") + b"d" + u16(1) + u8(1) + b"ab",
        "R",
        12,
        "missing NUL terminator for Relation column 0 name",
    ),
    Bad(
        "relation namespace bad UTF-8",
        b"R" + u32(1) + b"\xc3(\x00" + cstr("t"),
        "R",
        5,
        "invalid UTF-8 in Relation namespace",
    ),
    Bad(
        "type name no NUL",
        b"Y" + u32(1) + cstr("s") + b"n",
        "Y",
        7,
        "missing NUL terminator for Type name",
    ),
    Bad(
        "message negative length",
        b"M" + u8(0) + u64(1) + cstr("p") + i32(-3),
        "M",
        12,
        "negative content length -3",
    ),
    Bad(
        "message content cut",
        b"M" + u8(0) + u64(1) + cstr("p") + i32(3) + b"ab",
        "M",
        16,
        "content needs 3 bytes at offset 16, 2 left",
    ),
    Bad(
        "message trailing",
        b"M" + u8(0) + u64(1) + cstr("p") + i32(1) + b"ab",
        "M",
        17,
        "1 trailing bytes",
    ),
    Bad("stream start first_segment 2", b"S" + u32(1) + u8(2), "S", 5, "bad first_segment 2"),
    Bad(
        "stream start cut", b"S" + u32(1), "S", 5, "first_segment needs 1 byte at offset 5, 0 left"
    ),
    Bad(
        "stream stop trailing",
        b"E\x00",
        "E",
        1,
        "1 trailing bytes after Stream Stop message",
        in_stream=True,
    ),
    Bad(
        "stream commit flags",
        b"c" + u32(1) + u8(1) + u64(1) + u64(2) + i64(3),
        "c",
        5,
        "unrecognized flags 1 in Stream Commit message",
    ),
    Bad(
        "stream abort without info under parallel",
        b"A" + u32(1) + u32(1),
        "A",
        9,
        "abort_lsn needs 8 bytes at offset 9, 0 left",
    ),
    Bad(
        "stream abort with info under on",
        b"A" + u32(1) + u32(1) + u64(1) + i64(1),
        "A",
        9,
        "16 trailing bytes after Stream Abort message",
        streaming="on",
    ),
    Bad(
        "prepare flags",
        b"P" + u8(4) + u64(1) + u64(2) + i64(3) + u32(4) + cstr("g"),
        "P",
        1,
        "unrecognized flags 4 in Prepare message",
    ),
    Bad(
        "commit prepared gid no NUL",
        b"K" + u8(0) + u64(1) + u64(2) + i64(3) + u32(4) + b"g",
        "K",
        30,
        "missing NUL terminator for Commit Prepared gid",
    ),
    Bad(
        "rollback prepared cut",
        b"r" + u8(0) + u64(1) + u64(2) + i64(3),
        "r",
        26,
        "rollback_time needs 8 bytes at offset 26, 0 left",
    ),
    Bad(
        "stream prepare flags",
        b"p" + u8(1) + u64(1) + u64(2) + i64(3) + u32(4) + cstr(""),
        "p",
        1,
        "unrecognized flags 1 in Stream Prepare message",
    ),
    Bad(
        "begin prepare trailing",
        b"b" + u64(1) + u64(2) + i64(3) + u32(4) + cstr("g") + b"x",
        "b",
        31,
        "1 trailing bytes after Begin Prepare message",
    ),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_malformed_input_raises_protocol_error(bad: Bad) -> None:
    dec = Decoder(bad.proto_version, bad.streaming, in_stream=bad.in_stream)
    for payload in (bad.wire, bytearray(bad.wire), memoryview(bad.wire)):
        with pytest.raises(ProtocolError) as info:
            dec.decode(payload)
        err = info.value
        assert err.tag == bad.tag
        assert err.offset == bad.offset
        assert bad.text in err.message
        assert dec.in_stream == bad.in_stream


def test_error_text_names_tag_and_offset_and_pickles() -> None:
    with pytest.raises(ProtocolError) as info:
        Decoder().decode(BEGIN[:5])
    err = info.value
    assert "(tag B, offset 1)" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is ProtocolError
    assert (again.tag, again.offset, again.message) == (err.tag, err.offset, err.message)


def test_large_payload_errors_are_the_same_as_small() -> None:
    """Past the copy limit a memoryview is walked in place; errors must not change."""
    big = b"v" * 20_000
    wire = INS + u16(2) + b"t" + i32(len(big)) + big + b"t" + i32(10) + b"short"
    small = INS + u16(2) + b"t" + i32(1) + b"v" + b"t" + i32(10) + b"short"
    for payload in (wire, memoryview(wire), bytearray(wire)):
        with pytest.raises(ProtocolError) as info:
            Decoder().decode(payload)
        assert info.value.offset == len(wire) - 5
        assert "column 1 value needs 10 bytes" in info.value.message
    with pytest.raises(ProtocolError) as small_info:
        Decoder().decode(small)
    assert small_info.value.message == info.value.message.replace(
        f"offset {len(wire) - 5}", f"offset {len(small) - 5}"
    )
