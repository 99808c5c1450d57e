"""Arbitrary and mutated bytes: the decoder returns a message or raises ProtocolError."""

# Nothing else may escape, a failed decode must leave the stream state as it was, and
# the answer must not depend on whether the payload is bytes, bytearray or a view.

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import Decoder, encode
from sparkapply.pgoutput import messages as m
from tests.pgoutput import strategies as s

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_TAGS = b"BCORYIUDTMSEcAbPKrp"
Outcome = tuple[str, object]
Setup = tuple[int, s.Streaming, bool]  # protocol version, streaming, inside a stream block
Case = tuple[int, s.Streaming, bool, bytes]  # a setup and a valid message's bytes


def _outcome(dec: Decoder, payload: bytes | bytearray | memoryview) -> Outcome:
    """What decoding does, as a comparable value; fails the test on a foreign exception."""
    before = dec.in_stream
    try:
        msg = dec.decode(payload)
    except ProtocolError as e:
        assert dec.in_stream == before, "a failed decode changed the stream state"
        assert e.tag is None or isinstance(e.tag, str)
        assert isinstance(e.offset, int) and 0 <= e.offset <= len(payload)
        return ("error", (e.message, e.tag, e.offset))
    if isinstance(msg, m.StreamStart):
        assert not before and dec.in_stream
    elif isinstance(msg, m.StreamStop):
        assert before and not dec.in_stream
    else:
        assert dec.in_stream == before
    return ("message", msg)


def _check(payload: bytes, proto: int, streaming: s.Streaming, in_stream: bool) -> Outcome:
    """Decode as bytes, bytearray and memoryview: same outcome every time."""
    outcomes = [
        _outcome(Decoder(proto, streaming, in_stream=in_stream), p)
        for p in (payload, bytearray(payload), memoryview(payload))
    ]
    assert outcomes[0] == outcomes[1] == outcomes[2]
    return outcomes[0]


@st.composite
def _setup(draw: st.DrawFn) -> Setup:
    proto, streaming = draw(s.negotiations())
    return proto, streaming, s.stream_active(proto, streaming) and draw(st.booleans())


@st.composite
def _valid(draw: st.DrawFn) -> Case:
    proto, streaming, in_stream = draw(_setup())
    msg = draw(s.messages(proto, streaming, in_stream=in_stream))
    return proto, streaming, in_stream, encode(msg, proto_version=proto, streaming=streaming)


@SETTINGS
@given(_setup(), st.binary(max_size=64))
def test_random_bytes(setup: Setup, payload: bytes) -> None:
    _check(payload, *setup)


@SETTINGS
@given(_setup(), st.sampled_from(_TAGS), st.binary(max_size=64))
def test_random_bodies_behind_known_tags(setup: Setup, tag: int, body: bytes) -> None:
    _check(bytes((tag,)) + body, *setup)


@SETTINGS
@given(_valid(), st.data())
def test_every_truncation_is_an_error(case: Case, data: st.DataObject) -> None:
    """Every message's length follows from its content, so no strict prefix is valid."""
    proto, streaming, in_stream, wire = case
    cut = data.draw(st.integers(0, len(wire) - 1))
    kind, _ = _check(wire[:cut], proto, streaming, in_stream)
    assert kind == "error"


@SETTINGS
@given(_valid(), st.binary(min_size=1, max_size=8))
def test_appended_bytes_are_an_error(case: Case, extra: bytes) -> None:
    proto, streaming, in_stream, wire = case
    kind, detail = _check(wire + extra, proto, streaming, in_stream)
    assert kind == "error"
    assert isinstance(detail, tuple) and "trailing bytes" in detail[0]


@SETTINGS
@given(_valid(), st.data())
def test_flipped_inserted_and_deleted_bytes(case: Case, data: st.DataObject) -> None:
    proto, streaming, in_stream, wire = case
    buf = bytearray(wire)
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        i = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[i] ^= data.draw(st.integers(1, 255))
        elif op == "insert":
            buf.insert(i, data.draw(st.integers(0, 255)))
        elif buf:
            del buf[i]
    _check(bytes(buf), proto, streaming, in_stream)


@SETTINGS
@given(_setup(), st.binary(max_size=48), st.data())
def test_a_failed_decode_leaves_the_decoder_usable(
    setup: Setup, junk: bytes, data: st.DataObject
) -> None:
    """After any outcome, the decoder decodes the next valid message like a fresh one."""
    proto, streaming, in_stream = setup
    dec = Decoder(proto, streaming, in_stream=in_stream)
    _outcome(dec, junk)
    state = dec.in_stream
    msg = data.draw(s.messages(proto, streaming, in_stream=state))
    wire = encode(msg, proto_version=proto, streaming=streaming)
    assert dec.decode(wire) == msg
    fresh = Decoder(proto, streaming, in_stream=state)
    assert fresh.decode(wire) == msg and fresh.in_stream == dec.in_stream


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=16), st.integers(16_385, 20_000), st.binary(max_size=16))
def test_large_random_payloads_as_views(head: bytes, size: int, tail: bytes) -> None:
    """Past the copy limit the view is walked in place: same answers as bytes."""
    for tag in (b"I", b"U", b"D", b"M", b"R"):
        payload = tag + head + bytes(size) + tail
        for in_stream in (False, True):
            _check(payload, 4, "parallel", in_stream)
