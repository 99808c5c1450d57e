"""Reading the body of each pgoutput message: changes and transaction control."""

from __future__ import annotations

import struct
from typing import Literal

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import messages
from sparkapply.pgoutput._tuples import (
    _columns,
    _read_tuple,
    _tuple_at,
)
from sparkapply.pgoutput._wire import (
    _INSERT_HEAD,
    _REPLICA_IDENTITIES,
    _STREAMED_INSERT_HEAD,
    Buffer,
    _error,
    _expect_end,
    _expect_zero_flags,
    _Fields,
    _name,
    _new_delete,
    _new_insert,
    _new_update,
    _read_string,
    _stream_prefix,
    tag_name,
)

# ---------------------------------------------------------------------------------
# Change messages

_INSERT_FIELDS = _Fields(("relation_id", "I"), ("tuple marker", "B"), ("column count", "H"))
_STREAMED_INSERT_FIELDS = _Fields(
    ("xid", "I"), ("relation_id", "I"), ("tuple marker", "B"), ("column count", "H")
)
_REL_MARKER_FIELDS = _Fields(("relation_id", "I"), ("tuple marker", "B"))


def _insert(streamed: bool, buf: Buffer) -> messages.Insert:
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
    if marker != messages.TUPLE_NEW:
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


def _update(streamed: bool, buf: Buffer) -> messages.Update:
    xid, o = _stream_prefix(streamed, buf)
    relid, marker = _REL_MARKER_FIELDS.read(buf, o)
    o += 5
    old_kind: Literal["K", "O"] | None = None
    old: messages.TupleData | None = None
    if marker in (messages.TUPLE_KEY, messages.TUPLE_OLD):
        old_kind = "K" if marker == messages.TUPLE_KEY else "O"
        old, o = _tuple_at(buf, o, "old tuple")
        if o >= len(buf):
            raise _error(
                buf,
                f"truncated Update message: new tuple marker needs 1 byte at offset {o}, 0 left",
                o,
            )
        marker = buf[o]
        o += 1
        if marker != messages.TUPLE_NEW:
            raise _bad_marker(buf, o - 1, "'N'")
    elif marker != messages.TUPLE_NEW:
        raise _bad_marker(buf, o - 1, "'K', 'O' or 'N'")
    new, o = _tuple_at(buf, o, "new tuple")
    _expect_end(buf, o)
    return _new_update(xid, relid, old_kind, old, new)


def _delete(streamed: bool, buf: Buffer) -> messages.Delete:
    xid, o = _stream_prefix(streamed, buf)
    relid, marker = _REL_MARKER_FIELDS.read(buf, o)
    o += 5
    if marker != messages.TUPLE_KEY and marker != messages.TUPLE_OLD:
        raise _bad_marker(buf, o - 1, "'K' or 'O'")
    old, o = _tuple_at(buf, o, "old tuple")
    _expect_end(buf, o)
    return _new_delete(xid, relid, "K" if marker == messages.TUPLE_KEY else "O", old)


def _bad_marker(buf: Buffer, o: int, expected: str) -> ProtocolError:
    return _error(
        buf,
        f"bad tuple marker {tag_name(buf[o])} in {_name(buf)} message (expected {expected})",
        o,
    )


_TRUNCATE_FIELDS = _Fields(("relation count", "I"), ("options", "B"))


def _truncate(streamed: bool, buf: Buffer) -> messages.Truncate:
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
    return messages.Truncate(xid, options, relation_ids)


_RELATION_TAIL = _Fields(("replica identity", "B"), ("column count", "H"))
_COLUMN_FLAGS = _Fields(("flags", "B"))
_COLUMN_TYPE = _Fields(("type_oid", "I"), ("type_modifier", "i"))
_OID = _Fields(("relation_id", "I"))
_TYPE_OID = _Fields(("type_oid", "I"))


def _relation(streamed: bool, buf: Buffer) -> messages.Relation:
    xid, o = _stream_prefix(streamed, buf)
    (relid,) = _OID.read(buf, o)
    namespace, o = _read_string(buf, o + 4, "namespace")
    name, o = _read_string(buf, o, "name")
    replident, natts = _RELATION_TAIL.read(buf, o)
    if replident not in _REPLICA_IDENTITIES:
        raise _error(
            buf,
            f"bad replica identity {tag_name(replident)} in Relation message"
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
        columns.append(messages.RelationColumn(flags, col_name, type_oid, typmod))
    _expect_end(buf, o)
    return messages.Relation(xid, relid, namespace, name, chr(replident), tuple(columns))


def _type(streamed: bool, buf: Buffer) -> messages.Type:
    xid, o = _stream_prefix(streamed, buf)
    (type_oid,) = _TYPE_OID.read(buf, o)
    namespace, o = _read_string(buf, o + 4, "namespace")
    name, o = _read_string(buf, o, "name")
    _expect_end(buf, o)
    return messages.Type(xid, type_oid, namespace, name)


_MESSAGE_HEAD = _Fields(("flags", "B"), ("lsn", "Q"))
_CONTENT_LENGTH = _Fields(("content length", "i"))


def _message(streamed: bool, buf: Buffer) -> messages.LogicalMessage:
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
    return messages.LogicalMessage(xid, flags, lsn, prefix, content)


# ---------------------------------------------------------------------------------
# Transaction control messages

_BEGIN = _Fields(("final_lsn", "Q"), ("commit_time", "q"), ("xid", "I"))
_COMMIT = _Fields(("flags", "B"), ("commit_lsn", "Q"), ("end_lsn", "Q"), ("commit_time", "q"))
_ORIGIN = _Fields(("commit_lsn", "Q"))


def _begin(buf: Buffer) -> messages.Begin:
    final_lsn, commit_time, xid = _BEGIN.read(buf, 1)
    _expect_end(buf, 1 + _BEGIN.size)
    return messages.Begin(final_lsn, commit_time, xid)


def _commit(buf: Buffer) -> messages.Commit:
    flags, commit_lsn, end_lsn, commit_time = _COMMIT.read(buf, 1)
    _expect_end(buf, 1 + _COMMIT.size)
    _expect_zero_flags(buf, flags, 1)
    return messages.Commit(flags, commit_lsn, end_lsn, commit_time)


def _origin(buf: Buffer) -> messages.Origin:
    (commit_lsn,) = _ORIGIN.read(buf, 1)
    name, o = _read_string(buf, 9, "name")
    _expect_end(buf, o)
    return messages.Origin(commit_lsn, name)


_STREAM_START = _Fields(("xid", "I"), ("first_segment", "B"))
_STREAM_COMMIT = _Fields(
    ("xid", "I"), ("flags", "B"), ("commit_lsn", "Q"), ("end_lsn", "Q"), ("commit_time", "q")
)
_STREAM_ABORT = _Fields(("xid", "I"), ("subxid", "I"))
_STREAM_ABORT_INFO = _Fields(("xid", "I"), ("subxid", "I"), ("abort_lsn", "Q"), ("abort_time", "q"))


def _stream_start(buf: Buffer) -> messages.StreamStart:
    xid, first = _STREAM_START.read(buf, 1)
    _expect_end(buf, 1 + _STREAM_START.size)
    if first > 1:
        raise _error(buf, f"bad first_segment {first} in Stream Start message (expected 0 or 1)", 5)
    return messages.StreamStart(xid, first == 1)


def _stream_stop(buf: Buffer) -> messages.StreamStop:
    _expect_end(buf, 1)
    return messages.StreamStop()


def _stream_commit(buf: Buffer) -> messages.StreamCommit:
    xid, flags, commit_lsn, end_lsn, commit_time = _STREAM_COMMIT.read(buf, 1)
    _expect_end(buf, 1 + _STREAM_COMMIT.size)
    _expect_zero_flags(buf, flags, 5)
    return messages.StreamCommit(xid, flags, commit_lsn, end_lsn, commit_time)


def _stream_abort(buf: Buffer) -> messages.StreamAbort:
    xid, subxid = _STREAM_ABORT.read(buf, 1)
    _expect_end(buf, 1 + _STREAM_ABORT.size)
    return messages.StreamAbort(xid, subxid)


def _stream_abort_info(buf: Buffer) -> messages.StreamAbort:
    xid, subxid, abort_lsn, abort_time = _STREAM_ABORT_INFO.read(buf, 1)
    _expect_end(buf, 1 + _STREAM_ABORT_INFO.size)
    return messages.StreamAbort(xid, subxid, abort_lsn, abort_time)


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


def _begin_prepare(buf: Buffer) -> messages.BeginPrepare:
    prepare_lsn, end_lsn, prepare_time, xid = _BEGIN_PREPARE.read(buf, 1)
    gid, o = _read_string(buf, 1 + _BEGIN_PREPARE.size, "gid")
    _expect_end(buf, o)
    return messages.BeginPrepare(prepare_lsn, end_lsn, prepare_time, xid, gid)


_PreparedCls = type[messages.Prepare] | type[messages.CommitPrepared] | type[messages.StreamPrepare]


def _prepare_like(cls: _PreparedCls, buf: Buffer) -> messages.PrepareLike:
    flags, lsn, end_lsn, time, xid = _PREPARE_LIKE.read(buf, 1)
    gid, o = _read_string(buf, 1 + _PREPARE_LIKE.size, "gid")
    _expect_end(buf, o)
    _expect_zero_flags(buf, flags, 1)
    return cls(flags, lsn, end_lsn, time, xid, gid)


def _rollback_prepared(buf: Buffer) -> messages.RollbackPrepared:
    flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid = (
        _ROLLBACK_PREPARED.read(buf, 1)
    )
    gid, o = _read_string(buf, 1 + _ROLLBACK_PREPARED.size, "gid")
    _expect_end(buf, o)
    _expect_zero_flags(buf, flags, 1)
    return messages.RollbackPrepared(
        flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid, gid
    )
