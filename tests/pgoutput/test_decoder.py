"""The decoder against hand-built bytes: every message kind, every error, the state rules."""

# The bytes are built here field by field from the protocol documentation, not with
# the encoder, so these tests also pin the encoder (test_encoder_writes_the_same_bytes).

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import Decoder, decode_message, encode
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput._wire import _fast_constructor
from sparkapply.pgoutput.encoder import encode_tuple
from tests.pgoutput.wire import (
    BEGIN,
    EMPTY,
    EMPTY_WIRE,
    KEY,
    KEY_WIRE,
    LSN1,
    LSN2,
    LSN3,
    ROW,
    ROW_WIRE,
    SUBXID,
    T1,
    T2,
    TOAST,
    TOAST_WIRE,
    XID,
    cstr,
    i32,
    i64,
    tup,
    u8,
    u16,
    u32,
    u64,
)

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
