"""The pgoutput encoder: a typed message back to its exact wire bytes.

Production code, not a test helper: the assembler stores a prepared transaction's
RELATION messages in the durable prepared store in their wire form, so that after a
restart the same :class:`~sparkapply.pgoutput.Decoder` reads them back exactly as it
read them from the walsender (no second serialisation of :class:`Relation` to keep in
step). Tests and fixtures build pgoutput streams with it too. ``decode(encode(m)) ==
m`` for every message (tests/pgoutput/test_roundtrip.py).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from sparkapply.pgoutput import messages
from sparkapply.pgoutput._wire import (
    _check_proto_version,
    _negotiated,
    _normalize_streaming,
    _requirement,
)

__all__ = ["encode", "encode_tuple"]

_XID = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")


def _string(s: str) -> bytes:
    data = s.encode("utf-8")
    if b"\x00" in data:
        raise ValueError(f"string contains NUL and cannot be sent: {s!r}")
    return data + b"\x00"


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else _XID.pack(xid)


def encode_tuple(row: messages.TupleData) -> bytes:
    """TupleData wire bytes: Int16 column count, then kind (+ Int32 length + bytes)."""
    if len(row.kinds) != len(row.values):
        raise ValueError(f"{len(row.kinds)} kinds but {len(row.values)} values")
    parts = [_U16.pack(len(row.kinds))]
    for i, (kind, value) in enumerate(zip(row.kinds, row.values, strict=True)):
        if kind in (messages.KIND_TEXT, messages.KIND_BINARY):
            if value is None or value is messages.UNCHANGED:
                raise ValueError(f"column {i}: kind {chr(kind)!r} needs a value")
            parts.append(bytes((kind,)) + _I32.pack(len(value)) + bytes(value))
        elif kind == messages.KIND_NULL:
            if value is not None:
                raise ValueError(f"column {i}: kind 'n' carries no value (None)")
            parts.append(bytes((kind,)))
        elif kind == messages.KIND_UNCHANGED:
            if value is not messages.UNCHANGED:
                raise ValueError(f"column {i}: kind 'u' carries no value (UNCHANGED)")
            parts.append(bytes((kind,)))
        else:
            raise ValueError(f"column {i}: bad kind {kind!r}")
    return b"".join(parts)


def _begin(m: messages.Begin) -> bytes:
    return b"B" + struct.pack(">QqI", m.final_lsn, m.commit_time, m.xid)


def _commit(m: messages.Commit) -> bytes:
    return b"C" + struct.pack(">BQQq", m.flags, m.commit_lsn, m.end_lsn, m.commit_time)


def _origin(m: messages.Origin) -> bytes:
    return b"O" + struct.pack(">Q", m.commit_lsn) + _string(m.name)


def _relation(m: messages.Relation) -> bytes:
    if len(m.replica_identity) != 1:
        raise ValueError(f"replica_identity must be one character: {m.replica_identity!r}")
    parts = [
        b"R",
        _xid(m.xid),
        struct.pack(">I", m.relation_id),
        _string(m.namespace),
        _string(m.name),
        struct.pack(">BH", ord(m.replica_identity), len(m.columns)),
    ]
    for c in m.columns:
        parts += [
            bytes((c.flags,)),
            _string(c.name),
            struct.pack(">Ii", c.type_oid, c.type_modifier),
        ]
    return b"".join(parts)


def _type(m: messages.Type) -> bytes:
    return (
        b"Y" + _xid(m.xid) + struct.pack(">I", m.type_oid) + _string(m.namespace) + _string(m.name)
    )


def _insert(m: messages.Insert) -> bytes:
    return b"I" + _xid(m.xid) + struct.pack(">I", m.relation_id) + b"N" + encode_tuple(m.new)


def _update(m: messages.Update) -> bytes:
    head = b"U" + _xid(m.xid) + struct.pack(">I", m.relation_id)
    if m.old_kind is None and m.old is None:
        return head + b"N" + encode_tuple(m.new)
    if m.old_kind not in ("K", "O") or m.old is None:
        raise ValueError(f"old_kind {m.old_kind!r} and old must be both set (K or O) or both None")
    return head + m.old_kind.encode() + encode_tuple(m.old) + b"N" + encode_tuple(m.new)


def _delete(m: messages.Delete) -> bytes:
    if m.old_kind not in ("K", "O"):
        raise ValueError(f"old_kind must be 'K' or 'O', not {m.old_kind!r}")
    head = b"D" + _xid(m.xid) + struct.pack(">I", m.relation_id)
    return head + m.old_kind.encode() + encode_tuple(m.old)


def _truncate(m: messages.Truncate) -> bytes:
    n = len(m.relation_ids)
    return b"T" + _xid(m.xid) + struct.pack(f">IB{n}I", n, m.options, *m.relation_ids)


def _message(m: messages.LogicalMessage) -> bytes:
    return (
        b"M"
        + _xid(m.xid)
        + struct.pack(">BQ", m.flags, m.lsn)
        + _string(m.prefix)
        + _I32.pack(len(m.content))
        + bytes(m.content)
    )


def _stream_start(m: messages.StreamStart) -> bytes:
    return b"S" + struct.pack(">IB", m.xid, 1 if m.first_segment else 0)


def _stream_stop(m: messages.StreamStop) -> bytes:
    return b"E"


def _stream_commit(m: messages.StreamCommit) -> bytes:
    return b"c" + struct.pack(">IBQQq", m.xid, m.flags, m.commit_lsn, m.end_lsn, m.commit_time)


def _stream_abort(m: messages.StreamAbort) -> bytes:
    if (m.abort_lsn is None) != (m.abort_time is None):
        raise ValueError("abort_lsn and abort_time must be both set or both None")
    body = struct.pack(">II", m.xid, m.subxid)
    if m.abort_lsn is not None:
        body += struct.pack(">Qq", m.abort_lsn, m.abort_time)
    return b"A" + body


def _begin_prepare(m: messages.BeginPrepare) -> bytes:
    fixed = struct.pack(">QQqI", m.prepare_lsn, m.end_lsn, m.prepare_time, m.xid)
    return b"b" + fixed + _string(m.gid)


def _prepare_like(
    tag: bytes,
) -> Callable[[messages.PrepareLike], bytes]:
    def encode_prepare_like(
        m: messages.PrepareLike,
    ) -> bytes:
        if isinstance(m, messages.CommitPrepared):
            lsn, end_lsn, time = m.commit_lsn, m.end_lsn, m.commit_time
        else:
            lsn, end_lsn, time = m.prepare_lsn, m.end_lsn, m.prepare_time
        return tag + struct.pack(">BQQqI", m.flags, lsn, end_lsn, time, m.xid) + _string(m.gid)

    return encode_prepare_like


def _rollback_prepared(m: messages.RollbackPrepared) -> bytes:
    fixed = struct.pack(
        ">BQQqqI",
        m.flags,
        m.prepare_end_lsn,
        m.rollback_end_lsn,
        m.prepare_time,
        m.rollback_time,
        m.xid,
    )
    return b"r" + fixed + _string(m.gid)


_ENCODERS: dict[type[Any], tuple[int, Callable[[Any], bytes]]] = {
    messages.Begin: (ord("B"), _begin),
    messages.Commit: (ord("C"), _commit),
    messages.Origin: (ord("O"), _origin),
    messages.Relation: (ord("R"), _relation),
    messages.Type: (ord("Y"), _type),
    messages.Insert: (ord("I"), _insert),
    messages.Update: (ord("U"), _update),
    messages.Delete: (ord("D"), _delete),
    messages.Truncate: (ord("T"), _truncate),
    messages.LogicalMessage: (ord("M"), _message),
    messages.StreamStart: (ord("S"), _stream_start),
    messages.StreamStop: (ord("E"), _stream_stop),
    messages.StreamCommit: (ord("c"), _stream_commit),
    messages.StreamAbort: (ord("A"), _stream_abort),
    messages.BeginPrepare: (ord("b"), _begin_prepare),
    messages.Prepare: (ord("P"), _prepare_like(b"P")),
    messages.CommitPrepared: (ord("K"), _prepare_like(b"K")),
    messages.RollbackPrepared: (ord("r"), _rollback_prepared),
    messages.StreamPrepare: (ord("p"), _prepare_like(b"p")),
}


def encode(
    message: messages.Message, *, proto_version: int = 4, streaming: str | bool = "parallel"
) -> bytes:
    """The wire bytes of one pgoutput message, as a walsender with this negotiation sends.

    A faithful serializer, the decoder's inverse: ``xid`` is written iff it is not None
    (the caller decides whether the message sits inside a stream block), and Stream
    Abort's abort_lsn/abort_time iff they are not None. Raises ValueError for what
    cannot be written (a value out of its field's range, a NUL or lone surrogate in a
    string, a TupleData whose kinds and values disagree) and for message kinds that do
    not exist under this negotiation. It does not enforce the decoder's value rules
    (zero flags, replica identity), so tests can build bytes the decoder must reject.
    """
    _check_proto_version(proto_version)
    mode = _normalize_streaming(streaming)
    try:
        tag, write = _ENCODERS[type(message)]
    except KeyError:
        raise TypeError(f"not a pgoutput message: {type(message).__name__}") from None
    if not _negotiated(tag, proto_version, mode):
        raise ValueError(
            f"{type(message).__name__} needs {_requirement(tag)}, not protocol"
            f" {proto_version} with streaming {mode}"
        )
    try:
        return write(message)
    except (struct.error, OverflowError, UnicodeEncodeError) as e:
        raise ValueError(f"cannot encode {message!r}: {e}") from e
