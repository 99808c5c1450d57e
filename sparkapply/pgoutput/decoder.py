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
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import fields
from functools import partial
from itertools import repeat
from types import MemberDescriptorType
from typing import Any, Literal, NoReturn, TypeVar

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RelationColumn,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)

__all__ = ["Decoder", "decode_message"]

Buffer = bytes | memoryview
Streaming = Literal["off", "on", "parallel"]
_Handler = Callable[[Buffer], Message]
_T = TypeVar("_T")

# Message names, as errors and the documentation spell them.
_NAMES: dict[int, str] = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}

_STREAM_TAGS = frozenset(map(ord, "SEcA"))  # protocol 2 + streaming
_TWO_PHASE_TAGS = frozenset(map(ord, "bPKr"))  # protocol 3
_STREAM_PREPARE_TAG = ord("p")  # protocol 3 + streaming
_REPLICA_IDENTITIES = frozenset(b"dnfi")

# Payloads up to this size arriving as memoryview are copied to bytes once: slicing
# bytes and skipping a bytes() per value is faster than walking the view (measured:
# ~10% at 100 B, even at 16 KB; at 64 KB walking the view is 1.5x faster, at 1 MB 30x).
_COPY_LIMIT = 16384

_NUL = re.compile(b"\x00")

_U32 = struct.Struct(">I").unpack_from
_I32 = struct.Struct(">i").unpack_from
_INSERT_HEAD = struct.Struct(">IBH").unpack_from  # relation id, 'N', column count
_STREAMED_INSERT_HEAD = struct.Struct(">IIBH").unpack_from  # xid first


# ---------------------------------------------------------------------------------
# Negotiation (shared with the encoder)


def _normalize_streaming(streaming: str | bool) -> Streaming:
    if streaming is True:
        return "on"
    if streaming is False:
        return "off"
    if streaming == "off":
        return "off"
    if streaming == "on":
        return "on"
    if streaming == "parallel":
        return "parallel"
    raise ValueError(f"streaming must be 'off', 'on', 'parallel' or a bool, not {streaming!r}")


def _check_proto_version(proto_version: int) -> None:
    if type(proto_version) is not int or not 1 <= proto_version <= 4:
        raise ValueError(f"proto_version must be 1, 2, 3 or 4, not {proto_version!r}")


def _stream_negotiated(proto_version: int, streaming: Streaming) -> bool:
    return proto_version >= 2 and streaming != "off"


def _abort_info_negotiated(proto_version: int, streaming: Streaming) -> bool:
    return proto_version >= 4 and streaming == "parallel"


def _negotiated(tag: int, proto_version: int, streaming: Streaming) -> bool:
    """Whether a message with this tag can arrive under this negotiation."""
    if tag in _STREAM_TAGS:
        return _stream_negotiated(proto_version, streaming)
    if tag in _TWO_PHASE_TAGS:
        return proto_version >= 3
    if tag == _STREAM_PREPARE_TAG:
        return proto_version >= 3 and _stream_negotiated(proto_version, streaming)
    return tag in _NAMES


def _requirement(tag: int) -> str:
    if tag in _STREAM_TAGS:
        return "protocol >= 2 with streaming"
    if tag == _STREAM_PREPARE_TAG:
        return "protocol >= 3 with streaming"
    return "protocol >= 3"


# ---------------------------------------------------------------------------------
# Errors


def _tag_name(byte: int) -> str:
    return chr(byte) if 0x21 <= byte <= 0x7E else f"0x{byte:02x}"


def _bytes(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


def _error(buf: Buffer, message: str, offset: int) -> ProtocolError:
    return ProtocolError(message, tag=_tag_name(buf[0]), offset=offset)


def _name(buf: Buffer) -> str:
    return _NAMES.get(buf[0], "message")


class _Fields:
    """A run of fixed-width fields read with one ``unpack_from``.

    Knows each field's name and offset, so a short buffer is reported as the exact
    field that is cut off instead of struct.error.
    """

    __slots__ = ("_layout", "size", "unpack_from")

    def __init__(self, *fields: tuple[str, str]) -> None:
        st = struct.Struct(">" + "".join(code for _, code in fields))
        self.unpack_from = st.unpack_from
        self.size = st.size
        layout = []
        offset = 0
        for name, code in fields:
            width = struct.calcsize(">" + code)
            layout.append((name, offset, width))
            offset += width
        self._layout = tuple(layout)

    def read(self, buf: Buffer, o: int, where: str = "") -> tuple[Any, ...]:
        try:
            return self.unpack_from(buf, o)
        except struct.error:
            raise self.truncated(buf, o, where) from None

    def truncated(self, buf: Buffer, o: int, where: str = "") -> ProtocolError:
        end = len(buf)
        for name, offset, width in self._layout:
            at = o + offset
            if at + width > end:
                field = f"{where} {name}" if where else name
                left = max(end - at, 0)
                return _error(
                    buf,
                    f"truncated {_name(buf)} message: {field} needs {_bytes(width)}"
                    f" at offset {at}, {left} left",
                    at,
                )
        return _error(buf, f"truncated {_name(buf)} message", o)  # pragma: no cover


def _read_string(buf: Buffer, o: int, field: str) -> tuple[str, int]:
    m = _NUL.search(buf, o)
    if m is None:
        raise _error(buf, f"missing NUL terminator for {_name(buf)} {field}", o)
    nul = m.start()
    try:
        return str(buf[o:nul], "utf-8"), nul + 1
    except UnicodeDecodeError as e:
        raise _error(
            buf, f"invalid UTF-8 in {_name(buf)} {field}: {e.reason}", o + e.start
        ) from None


def _expect_end(buf: Buffer, o: int) -> None:
    extra = len(buf) - o
    if extra:
        raise _error(buf, f"{extra} trailing bytes after {_name(buf)} message", o)


def _expect_zero_flags(buf: Buffer, flags: int, o: int) -> None:
    if flags:
        raise _error(buf, f"unrecognized flags {flags} in {_name(buf)} message (must be 0)", o)


_XID = _Fields(("xid", "I"))


def _stream_prefix(streamed: bool, buf: Buffer) -> tuple[int | None, int]:
    """The xid that prefixes a message inside a stream block, and where the body starts."""
    if streamed:
        return _XID.read(buf, 1)[0], 5
    return None, 1


# ---------------------------------------------------------------------------------
# Fast construction of the hot message classes


def _fast_constructor(cls: type[_T], *names: str) -> Callable[..., _T]:
    """A positional constructor for the frozen slots dataclass ``cls``, skipping __init__.

    Frozen __init__ sets each field through object.__setattr__; setting the slot
    descriptors directly builds an equal object in about two thirds of the time.
    ``names`` are the fields the caller passes, in order. If the class is not exactly
    that (a field added or renamed in messages.py, a __post_init__, no slots), the
    class itself is returned: a change there can make decoding slower, never wrong.
    """
    descriptors = [cls.__dict__.get(n) for n in names]
    if (
        tuple(f.name for f in fields(cls)) != names  # type: ignore[arg-type]
        or hasattr(cls, "__post_init__")
        or not all(isinstance(d, MemberDescriptorType) for d in descriptors)
    ):
        return cls
    setters = [d.__set__ for d in descriptors]  # type: ignore[union-attr]
    new = object.__new__
    if len(setters) == 2:
        s0, s1 = setters

        def make2(a: Any, b: Any) -> Any:
            o = new(cls)
            s0(o, a)
            s1(o, b)
            return o

        return make2
    if len(setters) == 3:
        s0, s1, s2 = setters

        def make3(a: Any, b: Any, c: Any) -> Any:
            o = new(cls)
            s0(o, a)
            s1(o, b)
            s2(o, c)
            return o

        return make3
    if len(setters) == 4:
        s0, s1, s2, s3 = setters

        def make4(a: Any, b: Any, c: Any, d: Any) -> Any:
            o = new(cls)
            s0(o, a)
            s1(o, b)
            s2(o, c)
            s3(o, d)
            return o

        return make4
    if len(setters) == 5:
        s0, s1, s2, s3, s4 = setters

        def make5(a: Any, b: Any, c: Any, d: Any, e: Any) -> Any:
            o = new(cls)
            s0(o, a)
            s1(o, b)
            s2(o, c)
            s3(o, d)
            s4(o, e)
            return o

        return make5
    return cls


_new_tupledata: Callable[[bytes, tuple[bytes | None, ...]], TupleData] = _fast_constructor(
    TupleData, "kinds", "values"
)
_new_insert: Callable[[int | None, int, TupleData], Insert] = _fast_constructor(
    Insert, "xid", "relation_id", "new"
)
_new_update: Callable[[int | None, int, str | None, TupleData | None, TupleData], Update] = (
    _fast_constructor(Update, "xid", "relation_id", "old_kind", "old", "new")
)
_new_delete: Callable[[int | None, int, str, TupleData], Delete] = _fast_constructor(
    Delete, "xid", "relation_id", "old_kind", "old"
)


# ---------------------------------------------------------------------------------
# TupleData: the hot loop

_KIND_TEXT = 0x74  # 't'
_KIND_NULL = 0x6E  # 'n'
_KIND_UNCHANGED = 0x75  # 'u'
_KIND_BINARY = 0x62  # 'b'


def _columns(buf: bytes, o: int, end: int, natts: int) -> tuple[TupleData, int]:
    """Read ``natts`` columns starting at ``o``; return the row and the offset after it."""
    kinds: list[int] = []
    add_kind = kinds.append
    values: list[bytes | None] = []
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
            elif k == 0x6E or k == 0x75:  # 'n' / 'u': no value follows
                add(None)
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
    values: list[bytes | None] = []
    try:
        for _ in repeat(None, natts):
            k = buf[o]
            if k == 0x74 or k == 0x62:
                e = o + 5 + _U32(buf, o + 1)[0]
                if e > end:
                    raise _bad_length(buf, o, len(values))
                values.append(buf[o + 5 : e].tobytes())
                o = e
            elif k == 0x6E or k == 0x75:
                values.append(None)
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
        f"bad column kind {_tag_name(buf[o])} for column {column} in {_name(buf)} message"
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


# ---------------------------------------------------------------------------------
# Change messages

_INSERT_FIELDS = _Fields(("relation_id", "I"), ("tuple marker", "B"), ("column count", "H"))
_STREAMED_INSERT_FIELDS = _Fields(
    ("xid", "I"), ("relation_id", "I"), ("tuple marker", "B"), ("column count", "H")
)
_REL_MARKER_FIELDS = _Fields(("relation_id", "I"), ("tuple marker", "B"))
_N = 0x4E  # 'N'
_K = 0x4B  # 'K'
_O = 0x4F  # 'O'


def _insert(streamed: bool, buf: Buffer) -> Insert:
    xid: int | None
    try:
        if streamed:
            xid, relid, marker, natts = _STREAMED_INSERT_HEAD(buf, 1)
        else:
            relid, marker, natts = _INSERT_HEAD(buf, 1)
            xid = None
    except struct.error:
        raise (_STREAMED_INSERT_FIELDS if streamed else _INSERT_FIELDS).truncated(buf, 1) from None
    o = 12 if streamed else 8
    if marker != _N:
        raise _bad_marker(buf, o - 3, "'N'")
    if type(buf) is bytes:
        end = len(buf)
        new, o = _columns(buf, o, end, natts)
        if o != end:
            raise _error(buf, f"{end - o} trailing bytes after Insert message", o)
    else:
        new, o = _read_tuple(buf, o, natts)
        _expect_end(buf, o)
    return _new_insert(xid, relid, new)


def _update(streamed: bool, buf: Buffer) -> Update:
    xid, o = _stream_prefix(streamed, buf)
    relid, marker = _REL_MARKER_FIELDS.read(buf, o)
    o += 5
    old_kind: Literal["K", "O"] | None = None
    old: TupleData | None = None
    if marker in (_K, _O):
        old_kind = "K" if marker == _K else "O"
        old, o = _tuple_at(buf, o, "old tuple")
        if o >= len(buf):
            raise _error(
                buf,
                f"truncated Update message: new tuple marker needs 1 byte at offset {o}, 0 left",
                o,
            )
        marker = buf[o]
        o += 1
        if marker != _N:
            raise _bad_marker(buf, o - 1, "'N'")
    elif marker != _N:
        raise _bad_marker(buf, o - 1, "'K', 'O' or 'N'")
    new, o = _tuple_at(buf, o, "new tuple")
    _expect_end(buf, o)
    return _new_update(xid, relid, old_kind, old, new)


def _delete(streamed: bool, buf: Buffer) -> Delete:
    xid, o = _stream_prefix(streamed, buf)
    relid, marker = _REL_MARKER_FIELDS.read(buf, o)
    o += 5
    if marker != _K and marker != _O:
        raise _bad_marker(buf, o - 1, "'K' or 'O'")
    old, o = _tuple_at(buf, o, "old tuple")
    _expect_end(buf, o)
    return _new_delete(xid, relid, "K" if marker == _K else "O", old)


def _bad_marker(buf: Buffer, o: int, expected: str) -> ProtocolError:
    return _error(
        buf,
        f"bad tuple marker {_tag_name(buf[o])} in {_name(buf)} message (expected {expected})",
        o,
    )


_TRUNCATE_FIELDS = _Fields(("relation count", "I"), ("options", "B"))


def _truncate(streamed: bool, buf: Buffer) -> Truncate:
    xid, o = _stream_prefix(streamed, buf)
    count, options = _TRUNCATE_FIELDS.read(buf, o)
    o += 5
    end = len(buf)
    need = o + 4 * count
    if need > end:
        have = (end - o) // 4
        raise _error(
            buf,
            f"truncated Truncate message: relation id {have} of {count} needs 4 bytes"
            f" at offset {o + 4 * have}, {end - o - 4 * have} left",
            o + 4 * have,
        )
    _expect_end(buf, need)
    relation_ids = struct.unpack_from(f">{count}I", buf, o)
    return Truncate(xid, options, relation_ids)


_RELATION_TAIL = _Fields(("replica identity", "B"), ("column count", "H"))
_COLUMN_FLAGS = _Fields(("flags", "B"))
_COLUMN_TYPE = _Fields(("type_oid", "I"), ("type_modifier", "i"))
_OID = _Fields(("relation_id", "I"))
_TYPE_OID = _Fields(("type_oid", "I"))


def _relation(streamed: bool, buf: Buffer) -> Relation:
    xid, o = _stream_prefix(streamed, buf)
    (relid,) = _OID.read(buf, o)
    namespace, o = _read_string(buf, o + 4, "namespace")
    name, o = _read_string(buf, o, "name")
    replident, natts = _RELATION_TAIL.read(buf, o)
    if replident not in _REPLICA_IDENTITIES:
        raise _error(
            buf,
            f"bad replica identity {_tag_name(replident)} in Relation message"
            " (expected 'd', 'n', 'f' or 'i')",
            o,
        )
    o += 3
    columns = []
    for i in range(natts):
        where = f"column {i}"
        (flags,) = _COLUMN_FLAGS.read(buf, o, where)
        col_name, o = _read_string(buf, o + 1, f"{where} name")
        type_oid, typmod = _COLUMN_TYPE.read(buf, o, where)
        o += 8
        columns.append(RelationColumn(flags, col_name, type_oid, typmod))
    _expect_end(buf, o)
    return Relation(xid, relid, namespace, name, chr(replident), tuple(columns))


def _type(streamed: bool, buf: Buffer) -> Type:
    xid, o = _stream_prefix(streamed, buf)
    (type_oid,) = _TYPE_OID.read(buf, o)
    namespace, o = _read_string(buf, o + 4, "namespace")
    name, o = _read_string(buf, o, "name")
    _expect_end(buf, o)
    return Type(xid, type_oid, namespace, name)


_MESSAGE_HEAD = _Fields(("flags", "B"), ("lsn", "Q"))
_CONTENT_LENGTH = _Fields(("content length", "i"))


def _message(streamed: bool, buf: Buffer) -> LogicalMessage:
    xid, o = _stream_prefix(streamed, buf)
    flags, lsn = _MESSAGE_HEAD.read(buf, o)
    prefix, o = _read_string(buf, o + 9, "prefix")
    (n,) = _CONTENT_LENGTH.read(buf, o)
    if n < 0:
        raise _error(buf, f"negative content length {n} in Message message", o)
    o += 4
    left = len(buf) - o
    if n > left:
        raise _error(
            buf,
            f"truncated Message message: content needs {n} bytes at offset {o}, {left} left",
            o,
        )
    content = bytes(buf[o : o + n])
    _expect_end(buf, o + n)
    return LogicalMessage(xid, flags, lsn, prefix, content)


# ---------------------------------------------------------------------------------
# Transaction control messages

_BEGIN = _Fields(("final_lsn", "Q"), ("commit_time", "q"), ("xid", "I"))
_COMMIT = _Fields(("flags", "B"), ("commit_lsn", "Q"), ("end_lsn", "Q"), ("commit_time", "q"))
_ORIGIN = _Fields(("commit_lsn", "Q"))


def _begin(buf: Buffer) -> Begin:
    final_lsn, commit_time, xid = _BEGIN.read(buf, 1)
    _expect_end(buf, 1 + _BEGIN.size)
    return Begin(final_lsn, commit_time, xid)


def _commit(buf: Buffer) -> Commit:
    flags, commit_lsn, end_lsn, commit_time = _COMMIT.read(buf, 1)
    _expect_end(buf, 1 + _COMMIT.size)
    _expect_zero_flags(buf, flags, 1)
    return Commit(flags, commit_lsn, end_lsn, commit_time)


def _origin(buf: Buffer) -> Origin:
    (commit_lsn,) = _ORIGIN.read(buf, 1)
    name, o = _read_string(buf, 9, "name")
    _expect_end(buf, o)
    return Origin(commit_lsn, name)


_STREAM_START = _Fields(("xid", "I"), ("first_segment", "B"))
_STREAM_COMMIT = _Fields(
    ("xid", "I"), ("flags", "B"), ("commit_lsn", "Q"), ("end_lsn", "Q"), ("commit_time", "q")
)
_STREAM_ABORT = _Fields(("xid", "I"), ("subxid", "I"))
_STREAM_ABORT_INFO = _Fields(("xid", "I"), ("subxid", "I"), ("abort_lsn", "Q"), ("abort_time", "q"))


def _stream_start(buf: Buffer) -> StreamStart:
    xid, first = _STREAM_START.read(buf, 1)
    _expect_end(buf, 1 + _STREAM_START.size)
    if first > 1:
        raise _error(buf, f"bad first_segment {first} in Stream Start message (expected 0 or 1)", 5)
    return StreamStart(xid, first == 1)


def _stream_stop(buf: Buffer) -> StreamStop:
    _expect_end(buf, 1)
    return StreamStop()


def _stream_commit(buf: Buffer) -> StreamCommit:
    xid, flags, commit_lsn, end_lsn, commit_time = _STREAM_COMMIT.read(buf, 1)
    _expect_end(buf, 1 + _STREAM_COMMIT.size)
    _expect_zero_flags(buf, flags, 5)
    return StreamCommit(xid, flags, commit_lsn, end_lsn, commit_time)


def _stream_abort(buf: Buffer) -> StreamAbort:
    xid, subxid = _STREAM_ABORT.read(buf, 1)
    _expect_end(buf, 1 + _STREAM_ABORT.size)
    return StreamAbort(xid, subxid)


def _stream_abort_info(buf: Buffer) -> StreamAbort:
    xid, subxid, abort_lsn, abort_time = _STREAM_ABORT_INFO.read(buf, 1)
    _expect_end(buf, 1 + _STREAM_ABORT_INFO.size)
    return StreamAbort(xid, subxid, abort_lsn, abort_time)


_BEGIN_PREPARE = _Fields(
    ("prepare_lsn", "Q"), ("end_lsn", "Q"), ("prepare_time", "q"), ("xid", "I")
)
# Prepare, Commit Prepared and Stream Prepare share one layout.
_PREPARE_LIKE = _Fields(("flags", "B"), ("lsn", "Q"), ("end_lsn", "Q"), ("time", "q"), ("xid", "I"))
_ROLLBACK_PREPARED = _Fields(
    ("flags", "B"),
    ("prepare_end_lsn", "Q"),
    ("rollback_end_lsn", "Q"),
    ("prepare_time", "q"),
    ("rollback_time", "q"),
    ("xid", "I"),
)


def _begin_prepare(buf: Buffer) -> BeginPrepare:
    prepare_lsn, end_lsn, prepare_time, xid = _BEGIN_PREPARE.read(buf, 1)
    gid, o = _read_string(buf, 1 + _BEGIN_PREPARE.size, "gid")
    _expect_end(buf, o)
    return BeginPrepare(prepare_lsn, end_lsn, prepare_time, xid, gid)


_PreparedCls = type[Prepare] | type[CommitPrepared] | type[StreamPrepare]


def _prepare_like(cls: _PreparedCls, buf: Buffer) -> Prepare | CommitPrepared | StreamPrepare:
    flags, lsn, end_lsn, time, xid = _PREPARE_LIKE.read(buf, 1)
    gid, o = _read_string(buf, 1 + _PREPARE_LIKE.size, "gid")
    _expect_end(buf, o)
    _expect_zero_flags(buf, flags, 1)
    return cls(flags, lsn, end_lsn, time, xid, gid)


def _rollback_prepared(buf: Buffer) -> RollbackPrepared:
    flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid = (
        _ROLLBACK_PREPARED.read(buf, 1)
    )
    gid, o = _read_string(buf, 1 + _ROLLBACK_PREPARED.size, "gid")
    _expect_end(buf, o)
    _expect_zero_flags(buf, flags, 1)
    return RollbackPrepared(
        flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid, gid
    )


# ---------------------------------------------------------------------------------
# Dispatch tables


def _unknown(buf: Buffer) -> NoReturn:
    raise _error(buf, f"unknown pgoutput message tag {_tag_name(buf[0])}", 0)


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
