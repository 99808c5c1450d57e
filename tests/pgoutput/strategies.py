"""Hypothesis strategies for pgoutput messages, negotiations and whole sessions."""

# Every message drawn here is one the decoder accepts (flags that must be 0 are 0,
# replica identity is d/n/f/i), so decode(encode(m)) == m is the property to test.
# ``xid`` is drawn iff ``streamed``: inside a stream block change messages carry one.

from __future__ import annotations

from functools import cache
from typing import Literal

from hypothesis import strategies as st

from sparkapply.pgoutput import messages as m

Streaming = Literal["off", "on", "parallel"]

# What START_REPLICATION can negotiate, plus what the decoder tolerates beyond the
# server (streaming 'parallel' below protocol 4 acts as 'on').
NEGOTIATIONS: tuple[tuple[int, Streaming], ...] = (
    (1, "off"),
    (1, "on"),
    (2, "off"),
    (2, "on"),
    (3, "off"),
    (3, "on"),
    (3, "parallel"),
    (4, "off"),
    (4, "on"),
    (4, "parallel"),
)

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
i32 = st.integers(-(2**31), 2**31 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
lsns = u64
times = i64
xids = u32
oids = u32

# What a NUL-terminated UTF-8 string can hold: no NUL, no lone surrogates.
pg_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
values = st.binary(max_size=24)


def stream_active(proto_version: int, streaming: Streaming) -> bool:
    return proto_version >= 2 and streaming != "off"


def abort_info(proto_version: int, streaming: Streaming) -> bool:
    return proto_version >= 4 and streaming == "parallel"


def negotiations() -> st.SearchStrategy[tuple[int, Streaming]]:
    return st.sampled_from(NEGOTIATIONS)


@st.composite
def tuple_data(draw: st.DrawFn, max_columns: int = 8) -> m.TupleData:
    kinds = draw(st.lists(st.sampled_from(b"ntub"), max_size=max_columns))
    vals = tuple(
        draw(values)
        if k in (m.KIND_TEXT, m.KIND_BINARY)
        else m.UNCHANGED
        if k == m.KIND_UNCHANGED
        else None
        for k in kinds
    )
    return m.TupleData(bytes(kinds), vals)


def _xid(streamed: bool) -> st.SearchStrategy[int | None]:
    return xids if streamed else st.none()


def begins() -> st.SearchStrategy[m.Begin]:
    return st.builds(m.Begin, lsns, times, xids)


def commits() -> st.SearchStrategy[m.Commit]:
    return st.builds(m.Commit, st.just(0), lsns, lsns, times)


def origins() -> st.SearchStrategy[m.Origin]:
    return st.builds(m.Origin, lsns, pg_text)


def relation_columns() -> st.SearchStrategy[m.RelationColumn]:
    return st.builds(m.RelationColumn, u8, pg_text, oids, i32)


def relations(streamed: bool = False) -> st.SearchStrategy[m.Relation]:
    return st.builds(
        m.Relation,
        _xid(streamed),
        oids,
        pg_text,
        pg_text,
        st.sampled_from("dnfi"),
        st.lists(relation_columns(), max_size=5).map(tuple),
    )


def types(streamed: bool = False) -> st.SearchStrategy[m.Type]:
    return st.builds(m.Type, _xid(streamed), oids, pg_text, pg_text)


def inserts(streamed: bool = False) -> st.SearchStrategy[m.Insert]:
    return st.builds(m.Insert, _xid(streamed), oids, tuple_data())


_OLD_KINDS: tuple[Literal["K", "O"] | None, ...] = (None, "K", "O")


@st.composite
def updates(draw: st.DrawFn, streamed: bool = False) -> m.Update:
    old_kind = draw(st.sampled_from(_OLD_KINDS))
    old = None if old_kind is None else draw(tuple_data())
    return m.Update(draw(_xid(streamed)), draw(oids), old_kind, old, draw(tuple_data()))


def deletes(streamed: bool = False) -> st.SearchStrategy[m.Delete]:
    return st.builds(m.Delete, _xid(streamed), oids, st.sampled_from(["K", "O"]), tuple_data())


def truncates(streamed: bool = False) -> st.SearchStrategy[m.Truncate]:
    return st.builds(m.Truncate, _xid(streamed), u8, st.lists(oids, max_size=5).map(tuple))


def logical_messages(streamed: bool = False) -> st.SearchStrategy[m.LogicalMessage]:
    return st.builds(m.LogicalMessage, _xid(streamed), u8, lsns, pg_text, st.binary(max_size=32))


def stream_starts() -> st.SearchStrategy[m.StreamStart]:
    return st.builds(m.StreamStart, xids, st.booleans())


def stream_stops() -> st.SearchStrategy[m.StreamStop]:
    return st.just(m.StreamStop())


def stream_commits() -> st.SearchStrategy[m.StreamCommit]:
    return st.builds(m.StreamCommit, xids, st.just(0), lsns, lsns, times)


def stream_aborts(with_abort_info: bool) -> st.SearchStrategy[m.StreamAbort]:
    if with_abort_info:
        return st.builds(m.StreamAbort, xids, xids, lsns, times)
    return st.builds(m.StreamAbort, xids, xids)


def begin_prepares() -> st.SearchStrategy[m.BeginPrepare]:
    return st.builds(m.BeginPrepare, lsns, lsns, times, xids, pg_text)


def prepares() -> st.SearchStrategy[m.Prepare]:
    return st.builds(m.Prepare, st.just(0), lsns, lsns, times, xids, pg_text)


def commit_prepareds() -> st.SearchStrategy[m.CommitPrepared]:
    return st.builds(m.CommitPrepared, st.just(0), lsns, lsns, times, xids, pg_text)


def rollback_prepareds() -> st.SearchStrategy[m.RollbackPrepared]:
    return st.builds(m.RollbackPrepared, st.just(0), lsns, lsns, times, times, xids, pg_text)


def stream_prepares() -> st.SearchStrategy[m.StreamPrepare]:
    return st.builds(m.StreamPrepare, st.just(0), lsns, lsns, times, xids, pg_text)


@cache
def in_stream_messages() -> st.SearchStrategy[m.Message]:
    """Messages legal inside a stream block, except Stream Stop."""
    return st.one_of(
        origins(),
        relations(True),
        types(True),
        inserts(True),
        updates(True),
        deletes(True),
        truncates(True),
        logical_messages(True),
    )


@cache
def outside_messages(
    proto_version: int = 4, streaming: Streaming = "parallel"
) -> st.SearchStrategy[m.Message]:
    """Messages legal outside a stream block under this negotiation, except Stream Start."""
    options: list[st.SearchStrategy[m.Message]] = [
        begins(),
        commits(),
        origins(),
        relations(),
        types(),
        inserts(),
        updates(),
        deletes(),
        truncates(),
        logical_messages(),
    ]
    streams = stream_active(proto_version, streaming)
    if streams:
        options += [stream_commits(), stream_aborts(abort_info(proto_version, streaming))]
    if proto_version >= 3:
        options += [begin_prepares(), prepares(), commit_prepareds(), rollback_prepareds()]
        if streams:
            options.append(stream_prepares())
    return st.one_of(options)


@cache
def messages(
    proto_version: int = 4, streaming: Streaming = "parallel", *, in_stream: bool = False
) -> st.SearchStrategy[m.Message]:
    """Any single message legal in this state (state-changing ones included)."""
    if in_stream:
        return st.one_of(in_stream_messages(), stream_stops())
    if stream_active(proto_version, streaming):
        return st.one_of(outside_messages(proto_version, streaming), stream_starts())
    return outside_messages(proto_version, streaming)


@st.composite
def sessions(
    draw: st.DrawFn, proto_version: int = 4, streaming: Streaming = "parallel"
) -> list[m.Message]:
    """A message sequence one decoder can take in order: stream blocks well nested."""
    out: list[m.Message] = []
    streams = stream_active(proto_version, streaming)
    for _ in range(draw(st.integers(0, 6))):
        if streams and draw(st.booleans()):
            out.append(draw(stream_starts()))
            out += draw(st.lists(in_stream_messages(), max_size=4))
            out.append(m.StreamStop())
        else:
            out.append(draw(outside_messages(proto_version, streaming)))
    return out
