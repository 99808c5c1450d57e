"""The pgoutput decoder: one message's bytes in, one typed message out (protocols 1-4).

WHAT THE WIRE DOES NOT SAY
    Two layout changes carry no marker in the bytes. The Int32 xid prefix of Relation,
    Type, Insert, Update, Delete, Truncate and Message is there exactly inside a Stream
    Start ... Stream Stop block; and Stream Abort carries abort_lsn/abort_time only
    under protocol 4 with ``streaming = parallel``. Guessing wrong does not fail
    loudly: the xid is read as the relation id and every later field shifts by four
    bytes. So the decoder is told what START_REPLICATION negotiated and tracks the
    block itself, from the messages it decodes: one Decoder per replication session.

STREAM STATE
    Inside a block only the xid-prefixed messages, Origin (pgoutput writes it right
    after Stream Start) and Stream Stop are legal; outside, everything negotiated
    except Stream Stop. Begin, Commit, Stream Start/Commit/Abort or a two-phase message
    inside a block means our state and the server's have diverged, and every later
    change would be misread, so it raises. Whether a transaction is open is the
    assembler's business: it changes no layout.

ALL OR NOTHING
    ``decode`` returns a message and applies its state change (Stream Start enters the
    block, Stream Stop leaves it), or raises ``ProtocolError`` and changes nothing.
    Nothing else escapes: the happy path lets ``unpack_from``/indexing fail and only
    then works out which field was cut off, so checking costs nothing until it fails.

VALUE RULES
    As PostgreSQL's own reader (proto.c): flags documented as "must be 0" (Commit,
    Stream Commit, Prepare, Commit Prepared, Rollback Prepared, Stream Prepare) are
    rejected otherwise. Replica identity must be d/n/f/i and first_segment 0/1, since
    callers branch on them. Bit sets tested bit by bit (column flags, Truncate options,
    Message flags) keep unknown bits. LSNs, xids, OIDs and counts are unsigned;
    timestamps, the type modifier and value lengths signed (a negative length raises).

SPEED
    Insert/Update/Delete are the hot path. Dispatch is one list index on the first
    byte into a table built per decoder, with the negotiation and the block state baked
    into which table is active. The TupleData loop does one index, one compare chain
    and one ``unpack_from`` per column. The hot classes are built by setting their
    slots directly, skipping frozen ``__init__``'s ``object.__setattr__`` per field
    (~15% of an Insert). A small memoryview is copied to bytes once (faster than
    slicing a view); a large one is walked in place, so a big value is never held
    twice. Decoded messages never alias the caller's buffer.

LAYOUT
    This module holds the dispatch and the :class:`Decoder`; ``_wire.py`` the
    negotiation rules, message names, field layouts and fast constructors;
    ``_tuples.py`` the TupleData loop; ``_bodies.py`` each message's body.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NoReturn

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput._bodies import (
    _begin,
    _begin_prepare,
    _commit,
    _delete,
    _insert,
    _message,
    _origin,
    _prepare_like,
    _relation,
    _rollback_prepared,
    _stream_abort,
    _stream_abort_info,
    _stream_commit,
    _stream_start,
    _stream_stop,
    _truncate,
    _type,
    _update,
)
from sparkapply.pgoutput._wire import (
    _NAMES,
    Buffer,
    Streaming,
    _abort_info_negotiated,
    _check_proto_version,
    _error,
    _name,
    _negotiated,
    _normalize_streaming,
    _requirement,
    _stream_negotiated,
    tag_name,
)
from sparkapply.pgoutput.messages import (
    CommitPrepared,
    Message,
    Prepare,
    StreamPrepare,
    StreamStart,
    StreamStop,
)

__all__ = ["Decoder", "decode_message"]

_Handler = Callable[[Buffer], Message]

# Payloads up to this size arriving as memoryview are copied to bytes once: slicing
# bytes and skipping a bytes() per value is faster than walking the view (measured:
# ~10% at 100 B, even at 16 KB; at 64 KB walking the view is 1.5x faster, at 1 MB 30x).
_COPY_LIMIT = 16384

# ---------------------------------------------------------------------------------
# Dispatch tables


def _unknown(buf: Buffer) -> NoReturn:
    raise _error(buf, f"unknown pgoutput message tag {tag_name(buf[0])}", 0)


def _not_negotiated(proto_version: int, streaming: Streaming, buf: Buffer) -> NoReturn:
    tag = buf[0]
    raise _error(
        buf,
        f"unexpected {_NAMES[tag]} message: it needs {_requirement(tag)}, but"
        f" protocol {proto_version} with streaming {streaming} was negotiated",
        0,
    )


def _illegal_in_stream(buf: Buffer) -> NoReturn:
    raise _error(buf, f"{_name(buf)} message inside a stream block (before Stream Stop)", 0)


def _stop_outside_stream(buf: Buffer) -> NoReturn:
    raise _error(buf, "Stream Stop message outside a stream block", 0)


# Legal inside a stream block (besides Stream Stop, which the Decoder handles).
_IN_STREAM: dict[int, _Handler] = {
    ord("O"): _origin,
    ord("R"): partial(_relation, True),
    ord("Y"): partial(_type, True),
    ord("I"): partial(_insert, True),
    ord("U"): partial(_update, True),
    ord("D"): partial(_delete, True),
    ord("T"): partial(_truncate, True),
    ord("M"): partial(_message, True),
}

_OUT_OF_STREAM: dict[int, _Handler] = {
    ord("B"): _begin,
    ord("C"): _commit,
    ord("O"): _origin,
    ord("R"): partial(_relation, False),
    ord("Y"): partial(_type, False),
    ord("I"): partial(_insert, False),
    ord("U"): partial(_update, False),
    ord("D"): partial(_delete, False),
    ord("T"): partial(_truncate, False),
    ord("M"): partial(_message, False),
    ord("c"): _stream_commit,
    ord("b"): _begin_prepare,
    ord("P"): partial(_prepare_like, Prepare),
    ord("K"): partial(_prepare_like, CommitPrepared),
    ord("r"): _rollback_prepared,
    ord("p"): partial(_prepare_like, StreamPrepare),
}


def _as_buffer(payload: bytes | bytearray | memoryview) -> Buffer:
    # A memoryview is what parse_copy_data hands over: take it without re-wrapping.
    if type(payload) is memoryview or isinstance(payload, memoryview | bytearray):
        view = payload if type(payload) is memoryview else memoryview(payload)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        return view.tobytes() if len(view) <= _COPY_LIMIT else view
    if isinstance(payload, bytes):  # a bytes subclass
        return bytes(payload)
    raise TypeError(f"pgoutput payload must be bytes-like, not {type(payload).__name__}")


class Decoder:
    """Decodes pgoutput messages of one replication session, tracking the stream block.

    ``proto_version`` and ``streaming`` must be what START_REPLICATION negotiated
    (see the module docstring for why the decoder cannot infer them). ``in_stream``
    starts the decoder inside a stream block, for decoding a captured fragment.
    """

    __slots__ = ("_handlers", "_inside", "_outside", "_proto_version", "_streaming")

    def __init__(
        self,
        proto_version: int = 4,
        streaming: str | bool = "parallel",
        *,
        in_stream: bool = False,
    ) -> None:
        _check_proto_version(proto_version)
        mode = _normalize_streaming(streaming)
        self._proto_version = proto_version
        self._streaming: Streaming = mode
        stream_ok = _stream_negotiated(proto_version, mode)
        if in_stream and not stream_ok:
            raise ValueError(
                f"in_stream=True needs streaming, but protocol {proto_version} with"
                f" streaming {mode} was given"
            )

        unknown: list[_Handler] = [_unknown] * 256
        not_negotiated: _Handler = partial(_not_negotiated, proto_version, mode)
        outside = list(unknown)
        inside = list(unknown)
        for tag in _NAMES:
            if not _negotiated(tag, proto_version, mode):
                outside[tag] = inside[tag] = not_negotiated
                continue
            outside[tag] = _OUT_OF_STREAM.get(tag, _stop_outside_stream)
            inside[tag] = _IN_STREAM.get(tag, _illegal_in_stream)
        if stream_ok:
            outside[ord("S")] = self._stream_start
            inside[ord("E")] = self._stream_stop
            if _abort_info_negotiated(proto_version, mode):
                outside[ord("A")] = _stream_abort_info
            else:
                outside[ord("A")] = _stream_abort
        self._outside = outside
        self._inside = inside
        self._handlers = inside if in_stream else outside

    @property
    def proto_version(self) -> int:
        return self._proto_version

    @property
    def streaming(self) -> Streaming:
        """The negotiated streaming mode, normalized ("off", "on" or "parallel")."""
        return self._streaming

    @property
    def in_stream(self) -> bool:
        """True between a Stream Start and its Stream Stop."""
        return self._handlers is self._inside

    def decode(self, payload: bytes | bytearray | memoryview) -> Message:
        """Decode one pgoutput message (the payload of one XLogData frame).

        Raises ProtocolError for anything malformed or out of place, leaving the
        stream state as it was.
        """
        buf = payload if type(payload) is bytes else _as_buffer(payload)
        try:
            tag = buf[0]
        except IndexError:
            raise ProtocolError("empty pgoutput message", offset=0) from None
        return self._handlers[tag](buf)

    def _stream_start(self, buf: Buffer) -> StreamStart:
        msg = _stream_start(buf)
        self._handlers = self._inside
        return msg

    def _stream_stop(self, buf: Buffer) -> StreamStop:
        msg = _stream_stop(buf)
        self._handlers = self._outside
        return msg

    def __repr__(self) -> str:
        return (
            f"Decoder(proto_version={self.proto_version}, streaming={self.streaming!r},"
            f" in_stream={self.in_stream})"
        )


def decode_message(
    payload: bytes | bytearray | memoryview,
    *,
    proto_version: int = 4,
    streaming: str | bool = "parallel",
    in_stream: bool = False,
) -> Message:
    """Decode one message without keeping state (tests, tools); see :class:`Decoder`."""
    return Decoder(proto_version, streaming, in_stream=in_stream).decode(payload)
