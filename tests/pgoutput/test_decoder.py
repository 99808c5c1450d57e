"""The decoder against hand-built bytes: every message kind, every error, the state rules."""

# The bytes are built here field by field from the protocol documentation, not with
# the encoder, so these tests also pin the encoder (test_encoder_writes_the_same_bytes).

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass

import pytest

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import Decoder, decode_message, encode
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput._wire import _fast_constructor
from sparkapply.pgoutput.encoder import encode_tuple


def u8(v: int) -> bytes:
    return struct.pack(">B", v)


def u16(v: int) -> bytes:
    return struct.pack(">H", v)


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


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
CASES: list[tuple[str, bytes, m.Message, bool]] = [
    ("begin", b"B" + u64(LSN1) + i64(T1) + u32(XID), m.Begin(LSN1, T1, XID), False),
    (
        "commit",
        b"C" + u8(0) + u64(LSN1) + u64(LSN2) + i64(T1),
        m.Commit(0, LSN1, LSN2, T1),
        False,
    ),
    ("origin", b"O" + u64(LSN3) + cstr("orígin"), m.Origin(LSN3, "orígin"), False),
    ("origin in stream", b"O" + u64(0) + cstr(""), m.Origin(0, ""), True),
    (
        "relation",
        b"R"
        + u32(16384)
        + cstr("app")
        + cstr("tâble")
        + b"f"
        + u16(2)
        + (u8(1) + cstr("id") + u32(23) + i32(-1))
        + (u8(0) + cstr("v") + u32(1043) + i32(36)),
        m.Relation(
            None,
            16384,
            "app",
            "tâble",
            "f",
            (m.RelationColumn(1, "id", 23, -1), m.RelationColumn(0, "v", 1043, 36)),
        ),
        False,
    ),
    (
        "relation in stream, pg_catalog, no columns",
        b"R" + u32(XID) + u32(1) + cstr("") + cstr("t") + b"n" + u16(0),
        m.Relation(XID, 1, "", "t", "n", ()),
        True,
    ),
    (
        "type",
        b"Y" + u32(70000) + cstr("app") + cstr("mood"),
        m.Type(None, 70000, "app", "mood"),
        False,
    ),
    (
        "type in stream",
        b"Y" + u32(SUBXID) + u32(70000) + cstr("") + cstr("m"),
        m.Type(SUBXID, 70000, "", "m"),
        True,
    ),
    ("insert", b"I" + u32(16384) + b"N" + ROW_WIRE, m.Insert(None, 16384, ROW), False),
    ("insert no columns", b"I" + u32(1) + b"N" + EMPTY_WIRE, m.Insert(None, 1, EMPTY), False),
    (
        "insert in stream",
        b"I" + u32(SUBXID) + u32(16384) + b"N" + ROW_WIRE,
        m.Insert(SUBXID, 16384, ROW),
        True,
    ),
    (
        "update, no old tuple, unchanged toast",
        b"U" + u32(5) + b"N" + TOAST_WIRE,
        m.Update(None, 5, None, None, TOAST),
        False,
    ),
    (
        "update with old key",
        b"U" + u32(5) + b"K" + KEY_WIRE + b"N" + ROW_WIRE,
        m.Update(None, 5, "K", KEY, ROW),
        False,
    ),
    (
        "update with old row, in stream",
        b"U" + u32(XID) + u32(5) + b"O" + ROW_WIRE + b"N" + ROW_WIRE,
        m.Update(XID, 5, "O", ROW, ROW),
        True,
    ),
    ("delete by key", b"D" + u32(5) + b"K" + KEY_WIRE, m.Delete(None, 5, "K", KEY), False),
    (
        "delete by row, in stream",
        b"D" + u32(XID) + u32(5) + b"O" + ROW_WIRE,
        m.Delete(XID, 5, "O", ROW),
        True,
    ),
    (
        "truncate",
        b"T" + u32(2) + u8(3) + u32(16384) + u32(16390),
        m.Truncate(None, 3, (16384, 16390)),
        False,
    ),
    ("truncate in stream", b"T" + u32(XID) + u32(0) + u8(0), m.Truncate(XID, 0, ()), True),
    (
        "message",
        b"M" + u8(1) + u64(LSN1) + cstr("pfx") + i32(3) + b"a\x00b",
        m.LogicalMessage(None, 1, LSN1, "pfx", b"a\x00b"),
        False,
    ),
    (
        "message in stream, empty",
        b"M" + u32(XID) + u8(0) + u64(LSN1) + cstr("") + i32(0),
        m.LogicalMessage(XID, 0, LSN1, "", b""),
        True,
    ),
    ("stream start, first", b"S" + u32(XID) + u8(1), m.StreamStart(XID, True), False),
    ("stream start, later", b"S" + u32(XID) + u8(0), m.StreamStart(XID, False), False),
    ("stream stop", b"E", m.StreamStop(), True),
    (
        "stream commit",
        b"c" + u32(XID) + u8(0) + u64(LSN1) + u64(LSN2) + i64(T1),
        m.StreamCommit(XID, 0, LSN1, LSN2, T1),
        False,
    ),
    (
        "stream abort (parallel)",
        b"A" + u32(XID) + u32(SUBXID) + u64(LSN2) + i64(T2),
        m.StreamAbort(XID, SUBXID, LSN2, T2),
        False,
    ),
    (
        "begin prepare",
        b"b" + u64(LSN1) + u64(LSN2) + i64(T1) + u32(XID) + cstr("gid-1"),
        m.BeginPrepare(LSN1, LSN2, T1, XID, "gid-1"),
        False,
    ),
    (
        "prepare",
        b"P" + u8(0) + u64(LSN1) + u64(LSN2) + i64(T1) + u32(XID) + cstr(""),
        m.Prepare(0, LSN1, LSN2, T1, XID, ""),
        False,
    ),
    (
        "commit prepared",
        b"K" + u8(0) + u64(LSN2) + u64(LSN3) + i64(T1) + u32(XID) + cstr("g"),
        m.CommitPrepared(0, LSN2, LSN3, T1, XID, "g"),
        False,
    ),
    (
        "rollback prepared",
        b"r" + u8(0) + u64(LSN2) + u64(LSN3) + i64(T1) + i64(T2) + u32(XID) + cstr("g"),
        m.RollbackPrepared(0, LSN2, LSN3, T1, T2, XID, "g"),
        False,
    ),
    (
        "stream prepare",
        b"p" + u8(0) + u64(LSN1) + u64(LSN2) + i64(T1) + u32(XID) + cstr("gïd"),
        m.StreamPrepare(0, LSN1, LSN2, T1, XID, "gïd"),
        False,
    ),
]


@pytest.mark.parametrize(
    ("wire", "msg", "in_stream"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decodes_every_kind(wire: bytes, msg: m.Message, in_stream: bool) -> None:
    for payload in (wire, bytearray(wire), memoryview(b"junk" + wire + b"junk")[4:-4]):
        assert Decoder(4, "parallel", in_stream=in_stream).decode(payload) == msg
    assert decode_message(wire, in_stream=in_stream) == msg


@pytest.mark.parametrize(
    ("wire", "msg", "in_stream"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_encoder_writes_the_same_bytes(wire: bytes, msg: m.Message, in_stream: bool) -> None:
    assert encode(msg) == wire


def test_stream_abort_without_abort_info() -> None:
    wire = b"A" + u32(XID) + u32(SUBXID)
    negotiations: list[tuple[int, str | bool]] = [(2, "on"), (3, True), (4, "on"), (3, "parallel")]
    for proto, streaming in negotiations:
        assert decode_message(wire, proto_version=proto, streaming=streaming) == m.StreamAbort(
            XID, SUBXID
        )
        assert encode(m.StreamAbort(XID, SUBXID), proto_version=proto, streaming=streaming) == wire


def test_protocol_1_decodes_the_basic_messages() -> None:
    dec = Decoder(1, "off")
    assert dec.decode(b"I" + u32(9) + b"N" + KEY_WIRE) == m.Insert(None, 9, KEY)
    assert not dec.in_stream


def test_values_are_bytes_not_views() -> None:
    wire = bytearray(b"I" + u32(1) + b"N" + ROW_WIRE)
    got = Decoder().decode(memoryview(wire))
    assert isinstance(got, m.Insert)
    assert all(v is None or type(v) is bytes for v in got.new.values)
    wire[:] = bytes(len(wire))
    assert got == m.Insert(None, 1, ROW)


def test_memoryview_of_other_formats_and_offsets() -> None:
    wire = b"I" + u32(1) + b"N" + KEY_WIRE
    dec = Decoder()
    assert dec.decode(memoryview(wire).cast("c")) == m.Insert(None, 1, KEY)  # type: ignore[arg-type]  # a view of another format
    assert dec.decode(memoryview(b"xx" + wire)[2:]) == m.Insert(None, 1, KEY)

    class Sub(bytes):
        pass

    assert dec.decode(Sub(wire)) == m.Insert(None, 1, KEY)


def test_not_bytes_like_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Decoder().decode("I")  # type: ignore[arg-type]  # the wrong type, on purpose


# -- errors ------------------------------------------------------------------------

INS = b"I" + u32(7) + b"N"  # the Insert head; the tuple follows at offset 6
BEGIN = b"B" + u64(LSN1) + i64(T1) + u32(XID)


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


# -- the stream state ----------------------------------------------------------------

START = b"S" + u32(XID) + u8(1)
STOP = b"E"
OUTSIDE_ONLY = {
    "B": BEGIN,
    "C": b"C" + u8(0) + u64(1) + u64(2) + i64(3),
    "S": START,
    "c": b"c" + u32(XID) + u8(0) + u64(1) + u64(2) + i64(3),
    "A": b"A" + u32(XID) + u32(XID) + u64(1) + i64(2),
    "b": b"b" + u64(1) + u64(2) + i64(3) + u32(4) + cstr("g"),
    "P": b"P" + u8(0) + u64(1) + u64(2) + i64(3) + u32(4) + cstr("g"),
    "K": b"K" + u8(0) + u64(1) + u64(2) + i64(3) + u32(4) + cstr("g"),
    "r": b"r" + u8(0) + u64(1) + u64(2) + i64(3) + i64(4) + u32(5) + cstr("g"),
    "p": b"p" + u8(0) + u64(1) + u64(2) + i64(3) + u32(4) + cstr("g"),
}


def test_stream_block_tracks_start_and_stop() -> None:
    dec = Decoder()
    assert not dec.in_stream
    assert dec.decode(START) == m.StreamStart(XID, True)
    assert dec.in_stream
    assert dec.decode(b"O" + u64(1) + cstr("o")) == m.Origin(1, "o")
    assert dec.decode(b"I" + u32(XID) + u32(9) + b"N" + KEY_WIRE) == m.Insert(XID, 9, KEY)
    assert dec.decode(STOP) == m.StreamStop()
    assert not dec.in_stream
    # Outside the block the same change has no xid prefix.
    assert dec.decode(b"I" + u32(9) + b"N" + KEY_WIRE) == m.Insert(None, 9, KEY)


@pytest.mark.parametrize("tag", sorted(OUTSIDE_ONLY))
def test_outside_only_messages_are_rejected_inside_a_block(tag: str) -> None:
    dec = Decoder(in_stream=True)
    with pytest.raises(ProtocolError) as info:
        dec.decode(OUTSIDE_ONLY[tag])
    assert info.value.tag == tag and info.value.offset == 0
    assert "inside a stream block" in info.value.message
    assert dec.in_stream
    assert Decoder().decode(OUTSIDE_ONLY[tag]) is not None  # fine outside


def test_stream_stop_outside_a_block_is_rejected() -> None:
    dec = Decoder()
    with pytest.raises(ProtocolError, match="Stream Stop message outside a stream block"):
        dec.decode(STOP)
    assert not dec.in_stream


def test_failed_start_and_stop_do_not_change_state() -> None:
    dec = Decoder()
    for bad in (START[:-1], START + b"\x00", b"S" + u32(1) + u8(7)):
        with pytest.raises(ProtocolError):
            dec.decode(bad)
        assert not dec.in_stream
    dec.decode(START)
    with pytest.raises(ProtocolError):
        dec.decode(b"E\x00")
    assert dec.in_stream
    with pytest.raises(ProtocolError):
        dec.decode(b"I" + u32(9) + b"N" + KEY_WIRE)  # outside-style insert, misread
    assert dec.in_stream


def test_xid_prefix_depends_on_state_not_bytes() -> None:
    """The same bytes mean different things inside and outside a block."""
    wire = b"T" + u32(1) + u32(0) + u8(0)
    assert decode_message(wire, in_stream=True) == m.Truncate(1, 0, ())
    # Read without the prefix the bytes are a different, valid message: nothing in them
    # can catch a decoder that is wrong about the block, hence the state rules.
    assert decode_message(wire) == m.Truncate(None, 0, (0,))


# -- version gating ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("proto", "streaming", "tags", "needs"),
    [
        (1, "off", "SEcA", "protocol >= 2 with streaming"),
        (1, "parallel", "SEcA", "protocol >= 2 with streaming"),
        (4, "off", "SEcA", "protocol >= 2 with streaming"),
        (1, "off", "bPKr", "protocol >= 3"),
        (2, "on", "bPKr", "protocol >= 3"),
        (2, "on", "p", "protocol >= 3 with streaming"),
        (3, "off", "p", "protocol >= 3 with streaming"),
        (4, False, "p", "protocol >= 3 with streaming"),
    ],
)
def test_messages_outside_the_negotiated_protocol_are_rejected(
    proto: int, streaming: str | bool, tags: str, needs: str
) -> None:
    dec = Decoder(proto, streaming)
    for tag in tags:
        wire = OUTSIDE_ONLY.get(tag, STOP)
        with pytest.raises(ProtocolError) as info:
            dec.decode(wire)
        assert info.value.tag == tag and info.value.offset == 0
        assert f"it needs {needs}" in info.value.message
        assert f"protocol {proto} with streaming" in info.value.message


def test_two_phase_without_streaming_is_fine_on_protocol_3() -> None:
    dec = Decoder(3, "off")
    for tag in "bPKr":
        assert dec.decode(OUTSIDE_ONLY[tag]) is not None


# -- construction --------------------------------------------------------------------


def test_constructor_normalizes_and_validates() -> None:
    assert Decoder().proto_version == 4 and Decoder().streaming == "parallel"
    assert Decoder(2, True).streaming == "on"
    assert Decoder(2, False).streaming == "off"
    assert not Decoder().in_stream
    assert "in_stream=True" in repr(Decoder(in_stream=True))
    for proto in (0, 5, True, "4", 4.0):
        with pytest.raises(ValueError, match="proto_version"):
            Decoder(proto)  # type: ignore[arg-type]  # the wrong type, on purpose
    with pytest.raises(ValueError, match="streaming"):
        Decoder(4, "yes")
    with pytest.raises(ValueError, match="in_stream=True needs streaming"):
        Decoder(1, "on", in_stream=True)
    with pytest.raises(ValueError, match="in_stream=True needs streaming"):
        Decoder(4, "off", in_stream=True)


def test_decoders_do_not_share_state() -> None:
    a, b = Decoder(), Decoder()
    a.decode(START)
    assert a.in_stream and not b.in_stream


# -- the fast constructors -----------------------------------------------------------


def test_fast_constructor_builds_equal_objects() -> None:
    td = _fast_constructor(m.TupleData, "kinds", "values")(b"tn", (b"x", None))
    assert td == m.TupleData(b"tn", (b"x", None)) and hash(td) == hash(
        m.TupleData(b"tn", (b"x", None))
    )
    upd = _fast_constructor(m.Update, "xid", "relation_id", "old_kind", "old", "new")(
        1, 2, "K", td, td
    )
    assert upd == m.Update(1, 2, "K", td, td)
    with pytest.raises(AttributeError):
        upd.xid = 3  # type: ignore[misc]  # frozen: the assignment must fail


def test_fast_constructor_falls_back_for_unusual_classes() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            assert self.a > 0

    @dataclass(frozen=True)
    class NoSlots:
        a: int
        b: int

    assert _fast_constructor(Checked, "a") is Checked
    assert _fast_constructor(NoSlots, "a", "b") is NoSlots
    assert _fast_constructor(m.Insert, "xid", "relation_id") is m.Insert  # a field more
    assert _fast_constructor(m.Insert, "relation_id", "xid", "new") is m.Insert  # reordered
    assert _fast_constructor(m.Insert, "xid", "relation_id", "new") is not m.Insert


# -- the encoder's refusals ----------------------------------------------------------


def test_encoder_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError, match="needs protocol >= 2 with streaming"):
        encode(m.StreamStart(1, True), proto_version=1, streaming="off")
    with pytest.raises(ValueError, match="needs protocol >= 3"):
        encode(m.Prepare(0, 1, 2, 3, 4, "g"), proto_version=2, streaming="on")
    with pytest.raises(ValueError, match="NUL"):
        encode(m.Origin(1, "a\x00b"))
    with pytest.raises(ValueError, match="cannot encode"):
        encode(m.Begin(-1, 0, 0))
    with pytest.raises(ValueError, match="cannot encode"):
        encode(m.Origin(1, "\ud800"))
    with pytest.raises(ValueError, match="both set or both None"):
        encode(m.StreamAbort(1, 1, 5, None))
    with pytest.raises(ValueError, match="old_kind"):
        encode(m.Update(None, 1, "K", None, KEY))
    with pytest.raises(ValueError, match="old_kind"):
        encode(m.Delete(None, 1, "X", KEY))  # type: ignore[arg-type]  # a bad kind, on purpose
    with pytest.raises(ValueError, match="needs a value"):
        encode_tuple(m.TupleData(b"t", (None,)))
    with pytest.raises(ValueError, match="carries no value"):
        encode_tuple(m.TupleData(b"u", (b"x",)))
    with pytest.raises(ValueError, match="bad kind"):
        encode_tuple(m.TupleData(b"x", (None,)))
    with pytest.raises(ValueError, match="2 kinds but 1 values"):
        encode_tuple(m.TupleData(b"tt", (b"x",)))
    with pytest.raises(ValueError, match="one character"):
        encode(m.Relation(None, 1, "", "t", "dd", ()))
    with pytest.raises(TypeError, match="not a pgoutput message"):
        encode(object())  # type: ignore[arg-type]  # not a message, on purpose
    with pytest.raises(ValueError, match="proto_version"):
        encode(m.StreamStop(), proto_version=9)


def test_encoder_can_build_bytes_the_decoder_rejects() -> None:
    """A faithful serializer: negative tests build bad messages with it."""
    with pytest.raises(ProtocolError, match="unrecognized flags 1"):
        decode_message(encode(m.Commit(1, 2, 3, 4)))
    with pytest.raises(ProtocolError, match="bad replica identity"):
        decode_message(encode(m.Relation(None, 1, "", "t", "x", ())))


def test_unchanged_toast_is_an_explicit_value_distinct_from_null() -> None:
    import pickle

    wire = b"U" + u32(1) + b"N" + tup(b"1", None, None, kinds=b"tnu")[0]
    got = Decoder().decode(wire)
    assert isinstance(got, m.Update)
    assert got.new.values == (b"1", None, m.UNCHANGED)
    assert got.new.values[1] is None and got.new.values[2] is m.UNCHANGED
    assert got.new.is_null(1) and got.new.is_unchanged(2)
    assert pickle.loads(pickle.dumps(got.new.values[2])) is m.UNCHANGED  # on executors too
    big = memoryview(b"U" + u32(1) + b"N" + tup(b"x" * 20000, None, kinds=b"tu")[0])
    got_big = Decoder().decode(big)  # the in-place path
    assert isinstance(got_big, m.Update) and got_big.new.values[1] is m.UNCHANGED
    assert encode(got) == wire
