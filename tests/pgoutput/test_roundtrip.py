"""encode -> decode is the identity, for every message kind, state and negotiation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapply.pgoutput import Decoder, decode_message, encode
from sparkapply.pgoutput import messages as m
from tests.pgoutput import strategies as s

SETTINGS = settings(max_examples=400, deadline=None)


@st.composite
def _case(draw: st.DrawFn) -> tuple[int, s.Streaming, bool, m.Message]:
    proto, streaming = draw(s.negotiations())
    in_stream = s.stream_active(proto, streaming) and draw(st.booleans())
    return proto, streaming, in_stream, draw(s.messages(proto, streaming, in_stream=in_stream))


@SETTINGS
@given(_case())
def test_roundtrip_every_kind_state_and_negotiation(
    case: tuple[int, s.Streaming, bool, m.Message],
) -> None:
    proto, streaming, in_stream, msg = case
    wire = encode(msg, proto_version=proto, streaming=streaming)
    for payload in (wire, bytearray(wire), memoryview(wire)):
        dec = Decoder(proto, streaming, in_stream=in_stream)
        assert dec.decode(payload) == msg
        expect_in_stream = isinstance(msg, m.StreamStart) or (
            in_stream and not isinstance(msg, m.StreamStop)
        )
        assert dec.in_stream == expect_in_stream
    assert decode_message(wire, proto_version=proto, streaming=streaming, in_stream=in_stream) == (
        msg
    )


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_roundtrip_whole_session_with_one_decoder(data: st.DataObject) -> None:
    proto, streaming = data.draw(s.negotiations())
    session = data.draw(s.sessions(proto, streaming))
    dec = Decoder(proto, streaming)
    for msg in session:
        wire = encode(msg, proto_version=proto, streaming=streaming)
        assert dec.decode(wire) == msg
        assert encode(msg, proto_version=proto, streaming=streaming) == wire
    assert not dec.in_stream


@settings(max_examples=50, deadline=None)
@given(
    st.booleans(),
    st.binary(max_size=16),
    st.integers(20_000, 40_000),
    s.tuple_data(max_columns=3),
)
def test_roundtrip_large_payload_walked_in_place(
    streamed: bool, head: bytes, size: int, rest: m.TupleData
) -> None:
    """Past the copy limit a memoryview is read in place; the result must not alias it."""
    big = head + b"v" * size
    row = m.TupleData(b"t" + rest.kinds, (big, *rest.values))
    msg = m.Insert(7 if streamed else None, 1, row)
    wire = bytearray(encode(msg))
    got = Decoder(in_stream=streamed).decode(memoryview(wire))
    assert got == msg
    assert isinstance(got, m.Insert)
    assert all(v is None or v is m.UNCHANGED or type(v) is bytes for v in got.new.values)
    wire[:] = bytes(len(wire))  # the caller reuses its buffer
    assert got == msg


@settings(max_examples=100, deadline=None)
@given(s.updates(), s.deletes(streamed=True), s.logical_messages(streamed=True))
def test_roundtrip_large_messages_from_bytearray(
    upd: m.Update, dele: m.Delete, lm: m.LogicalMessage
) -> None:
    pad = b"z" * 20_000
    big_update = m.Update(
        upd.xid,
        upd.relation_id,
        upd.old_kind,
        upd.old,
        m.TupleData(upd.new.kinds + b"b", (*upd.new.values, pad)),
    )
    big_delete = m.Delete(
        dele.xid,
        dele.relation_id,
        dele.old_kind,
        m.TupleData(dele.old.kinds + b"t", (*dele.old.values, pad)),
    )
    big_message = m.LogicalMessage(lm.xid, lm.flags, lm.lsn, lm.prefix, lm.content + pad)
    assert Decoder().decode(bytearray(encode(big_update))) == big_update
    streamed = Decoder(in_stream=True)
    assert streamed.decode(bytearray(encode(big_delete))) == big_delete
    assert streamed.decode(memoryview(encode(big_message))) == big_message
