"""The assembler on encoded messages: no server, exact state transitions."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from sparkapply.changes.progress import Progress
from sparkapply.changes.spool import read_records
from sparkapply.changes.staged import ClosedChunk
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.errors import ProtocolError, StateError
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.frames import XLOG_DATA_HEADER, XLogData
from tests.changes.feed import Feed

REL = m.Relation(None, 100, "public", "t", "d", (m.RelationColumn(1, "id", 23, -1),))


def row(v: int, xid: int | None = None) -> m.Insert:
    return m.Insert(xid, 100, m.TupleData(b"t", (str(v).encode(),)))


def rel(xid: int | None) -> m.Relation:
    return m.Relation(xid, REL.relation_id, REL.namespace, REL.name, "d", REL.columns)


def test_ordinary_transactions_in_commit_order(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    f(m.Begin(2000, 0, 1), rel(None), row(1), m.Commit(0, 1990, 2000, 0))
    f(m.Begin(3000, 0, 2), row(2), row(3), m.Commit(0, 2990, 3000, 0))
    txns = f.take()
    assert [t.xid for t in txns] == [1, 2]
    assert f.values(txns[0]) == [1] and f.values(txns[1]) == [2, 3]
    assert txns[1].relations[100] == REL  # cache carried to a later txn
    assert f.progress.flushed == 0  # nothing durable yet


def test_a_partition_described_beside_its_root_is_not_the_transactions(tmp_path: Path) -> None:
    """publish_via_partition_root: pgoutput describes the root, then the partition the
    change is in, then sends the change named by the root. Only the root is a relation
    of the transaction (the apply makes no table of the partition), in an ordinary,
    a streamed and a prepared transaction alike."""

    def described(xid: int | None, relid: int, name: str) -> m.Relation:
        return m.Relation(xid, relid, "public", name, "d", REL.columns)

    def change(xid: int | None, v: int) -> m.Insert:
        return m.Insert(xid, 200, m.TupleData(b"t", (str(v).encode(),)))

    f = Feed(tmp_path)
    root, leaf = described(None, 200, "meas"), described(None, 201, "meas_2024")
    f(m.Begin(2000, 0, 1), root, leaf, change(None, 1), m.Commit(0, 1990, 2000, 0))
    f(m.StreamStart(10, True), described(10, 200, "meas"), described(10, 202, "meas_2025"))
    f(change(10, 2), m.StreamStop(), m.StreamCommit(10, 0, 5000, 5010, 0))
    f(m.BeginPrepare(6000, 6010, 0, 7, "g"), leaf, change(None, 3))
    f(m.Prepare(0, 6000, 6010, 0, 7, "g"), m.CommitPrepared(0, 7000, 7010, 0, 7, "g"))
    txns = f.take()
    assert [[r.name for r in t.relation_messages] for t in txns] == [["meas"], ["meas"], []]
    assert [t.relation_ids for t in txns] == [{200}] * 3
    assert [f.values(t) for t in txns] == [[1], [2], [3]]


def test_subtransaction_abort_truncates_and_keeps_relation(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    f(m.StreamStart(10, True), rel(10), row(1, 10), row(2, 11), m.StreamStop())
    f(m.StreamStart(10, False), row(3, 12), m.StreamStop())
    # Child first, then parent; and one for a subxact that changed nothing.
    f(m.StreamAbort(10, 12, 1, 0), m.StreamAbort(10, 11, 1, 0), m.StreamAbort(10, 99, 1, 0))
    f(m.StreamStart(10, False), row(4, 10), m.StreamStop())
    f(m.StreamCommit(10, 0, 5000, 5010, 0))
    (txn,) = f.take()
    assert f.values(txn) == [1, 4]
    assert txn.relation_messages[0].name == "t"


def test_relation_cut_off_by_subabort_is_written_back(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    f(m.StreamStart(10, True), rel(10), m.StreamStop())
    f(m.StreamStart(10, False), row(1, 11), m.StreamStop())
    f(m.StreamAbort(10, 11, 1, 0), m.StreamCommit(10, 0, 5000, 5010, 0))
    (txn,) = f.take()
    tags = [p[0] for s in txn.segments for p, _ in read_records(s)]
    assert tags == [m.TAG_RELATION]


def test_top_abort_discards_everything(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    f(m.StreamStart(10, True), rel(10), row(1, 10), m.StreamStop(), m.StreamAbort(10, 10, 1, 0))
    assert not f.asm.ready and f.asm.open_streams == 0
    assert not list((tmp_path / "spool").glob("stream-*"))


def test_prepare_is_durable_and_survives_a_restart(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    f(m.BeginPrepare(2000, 2010, 0, 7, "g"), rel(None), row(5), m.Prepare(0, 2000, 2010, 0, 7, "g"))
    assert f.progress.flushed == 2010  # staged: acknowledgeable
    assert f.store.xids() == [7]
    g = Feed(tmp_path)  # a new process: spool wiped, prepared store kept
    g(m.CommitPrepared(0, 3000, 3010, 0, 7, "g"))
    (txn,) = g.take()
    assert (txn.kind, txn.gid, txn.commit_lsn) == ("prepared", "g", 3000)
    assert g.values(txn) == [5]
    g.asm.release(txn)
    assert g.store.xids() == []


def test_rollback_prepared_unknown_is_noop_and_known_removes(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    f(m.RollbackPrepared(0, 100, 200, 0, 0, 42, "unknown"))
    f(m.BeginPrepare(2000, 2010, 0, 7, ""), rel(None), row(5), m.Prepare(0, 2000, 2010, 0, 7, ""))
    f(m.RollbackPrepared(0, 2010, 2100, 0, 0, 7, ""))
    assert f.store.xids() == [] and not f.asm.ready
    assert f.progress.flushed == 2100


def test_commit_prepared_of_unstaged_xid_is_an_error(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    with pytest.raises(StateError, match="never staged") as info:
        f(m.CommitPrepared(0, 3000, 3010, 0, 8, "lost"))
    assert info.value.context["xid"] == 8


def test_change_outside_transaction_is_a_protocol_error(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    with pytest.raises(ProtocolError, match="outside a transaction"):
        f(row(1))


def test_progress_waits_for_the_oldest_pending(tmp_path: Path) -> None:
    p = Progress(Lsn(5))
    a = p.add(10, done=False)
    p.add(20, done=True)  # a prepare staged after an undurable commit
    assert p.flushed == 5
    p.follow(100)  # something is pending: must not follow the server
    assert p.flushed == 5
    p.mark_done([a])
    assert p.flushed == 20
    p.follow(100)
    assert p.flushed == 100


# -- the burst path: feed_frames must be feed of each frame, exactly ----------------------

REL2 = m.Relation(None, 200, "public", "u", "d", (m.RelationColumn(1, "k", 23, -1),))
# REL2 after an ALTER TABLE: transactions before it and after it are described apart.
REL2B = m.Relation(
    None,
    200,
    "public",
    "u",
    "d",
    (m.RelationColumn(1, "k", 23, -1), m.RelationColumn(0, "v", 25, -1)),
)


def _random_messages(rnd: random.Random) -> list[m.Message]:
    """Ordinary transactions and interleaved streamed ones with subtransactions,
    subtransaction and top aborts, truncates and RELATION messages mid-run."""
    out: list[m.Message] = []
    streams: dict[int, list[int]] = {}  # open streamed xid -> its subxids
    next_xid = 10
    lsn = 1000
    tup = m.TupleData(b"t", (b"1",))
    for _ in range(60):
        lsn += 100
        choice = rnd.random()
        if choice < 0.35 or len(streams) >= 3:
            out.append(m.Begin(lsn, 0, next_xid))
            if rnd.random() < 0.3:
                out.append(rnd.choice((REL2, REL2B)))
            for _ in range(rnd.randint(0, 8)):
                relid = rnd.choice((100, 200))
                kind = rnd.random()
                if kind < 0.5:
                    out.append(m.Insert(None, relid, tup))
                elif kind < 0.8:
                    out.append(m.Update(None, relid, None, None, tup))
                elif kind < 0.95:
                    out.append(m.Delete(None, relid, "K", tup))
                else:
                    out.append(m.Truncate(None, 0, (relid,)))
            out.append(m.Commit(0, lsn - 10, lsn, 0))
            next_xid += 1
        elif choice < 0.7 or not streams:
            xid = rnd.choice([*streams, next_xid + 100])
            first = xid not in streams
            subs = streams.setdefault(xid, [])
            out.append(m.StreamStart(xid, first))
            if first:
                out.append(rel(xid))
            for _ in range(rnd.randint(1, 12)):
                if rnd.random() < 0.2:
                    subs.append(xid * 100 + len(subs) + 1)
                who = rnd.choice([xid, *subs])
                relid = rnd.choice((100, 100, 200))  # 200: described before the stream
                if rnd.random() < 0.6:
                    out.append(m.Insert(who, relid, tup))
                elif rnd.random() < 0.8:
                    out.append(m.Update(who, relid, None, None, tup))
                else:
                    out.append(m.Delete(who, relid, "K", tup))
            out.append(m.StreamStop())
        else:
            xid = rnd.choice(list(streams))
            subs = streams[xid]
            end = rnd.random()
            if end < 0.3 and subs:
                out.append(m.StreamAbort(xid, rnd.choice(subs), lsn, 0))
            elif end < 0.45:
                out.append(m.StreamAbort(xid, xid, lsn, 0))
                del streams[xid]
            else:
                out.append(m.StreamCommit(xid, 0, lsn - 10, lsn, 0))
                del streams[xid]
    return out


def _frames(msgs: list[m.Message]) -> list[tuple[int, memoryview]]:
    out = []
    for n, msg in enumerate(msgs):
        lsn = 5000 + 10 * n
        payload = encode(msg)
        out.append((lsn, memoryview(XLogData(lsn, lsn + 5, 0, payload).encode())))
    return out


def _state(f: Feed) -> list[tuple[object, ...]]:
    backlog = f.asm.backlog()
    pending = f.progress.pending
    txns = f.take()
    spooled = [[(bytes(p), s) for seg in t.segments for p, s in read_records(seg)] for t in txns]
    fields = [
        (
            t.xid,
            t.kind,
            (t.commit_lsn, t.end_lsn, t.commit_time),
            t.n_changes,
            # not t.nbytes: a run read column-wise spools each change as its whole
            # frame (spool.py, FLAG_FRAMED), 20 bytes more; the records read the same
            t.relation_ids,
            t.mutated_relation_ids,
            t.has_truncate,
            dict(t.relations),
            t.relation_messages,
            tuple(Path(c).name for c in t.cleanup),
        )
        for t in txns
    ]
    assert backlog.nbytes == sum(t.nbytes for t in txns)
    return [
        *zip(fields, spooled, strict=True),
        ("open", f.asm.open_streams, backlog.transactions, pending),
    ]


def _fed_both_ways(
    tmp_path: Path, rnd: random.Random, msgs: list[m.Message], longest: int
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The assembler's state after ``msgs`` fed one message at a time, and after them
    fed as bursts of frames of random lengths up to ``longest``."""
    frames = _frames([REL2, *msgs])
    one = Feed(tmp_path / "one")
    one.asm.relations[REL.relation_id] = REL
    for lsn, frame in frames:
        one.asm.feed(frame[XLOG_DATA_HEADER.size :], lsn)
    burst = Feed(tmp_path / "burst")
    burst.asm.relations[REL.relation_id] = REL
    i = 0
    while i < len(frames):
        n = rnd.randint(1, longest)
        burst.asm.feed_frames([f for _, f in frames[i : i + n]], XLOG_DATA_HEADER.size)
        i += n
    return _state(one), _state(burst)


@pytest.mark.parametrize("seed", range(12))
def test_feed_frames_is_feed_of_each_frame(tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    want, got = _fed_both_ways(tmp_path, rnd, _random_messages(rnd), 40)
    assert want[:-1], "the workload committed nothing"
    assert got == want


REL3 = m.Relation(None, 300, "public", "w", "d", (m.RelationColumn(1, "k", 23, -1),))


def _small_transactions(rnd: random.Random) -> list[m.Message]:
    """Runs of small ordinary transactions, as under pgbench (read column-wise,
    pgoutput/burst.py), broken now and then: a RELATION that changes a relation's
    entry mid-run, a relation described for the first time inside a transaction,
    empty transactions, an interleaved streamed chunk."""
    out: list[m.Message] = []
    tup = m.TupleData(b"t", (b"1",))
    lsn = 1000
    described = [100, 200]
    for xid in range(10, 400):
        lsn += 100
        if rnd.random() < 0.02:
            out += [m.StreamStart(xid + 10_000, True), rel(xid + 10_000)]
            out += [m.Insert(xid + 10_000, 100, tup), m.StreamStop()]
        out.append(m.Begin(lsn, 0, xid))
        if rnd.random() < 0.03:
            out.append(rnd.choice((REL2, REL2B)))
        if 300 not in described and rnd.random() < 0.05:
            out.append(REL3)
            described.append(300)
        for _ in range(rnd.choice((0, 1, 1, 1, 4, 5))):
            relid = rnd.choice(described)
            kind = rnd.random()
            if kind < 0.3:
                out.append(m.Insert(None, relid, tup))
            elif kind < 0.9:
                out.append(m.Update(None, relid, None, None, tup))
            else:
                out.append(m.Delete(None, relid, "K", tup))
        out.append(m.Commit(0, lsn - 10, lsn, xid))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_takes_what_fits_in_commit_order(tmp_path: Path, seed: int) -> None:
    """Under any limits a batch takes what a pass one transaction at a time takes (the
    first always, then while they fit), received in bursts as under pgbench; what is
    left keeps its count and bytes."""
    rnd = random.Random(seed)
    f = Feed(tmp_path)
    f.asm.relations[REL.relation_id] = REL
    frames = _frames([REL2, *_small_transactions(rnd)])
    for i in range(0, len(frames), 50):
        f.asm.feed_frames([fr for _, fr in frames[i : i + 50]], XLOG_DATA_HEADER.size)
    ready = [t for t, _ in f.asm.ready]
    assert len(ready) > 300
    while ready:
        max_txns = rnd.choice((1, 7, 60, 10_000))
        max_bytes = rnd.choice((1, 500, 8_000, 1 << 30))
        through = rnd.choice((None, ready[min(len(ready) - 1, rnd.randint(0, 80))].commit_lsn))
        want: list[CommittedTxn] = []
        nbytes = 0
        for t in ready:
            full = len(want) >= max_txns or (want and nbytes + t.nbytes > max_bytes)
            if full or (through is not None and t.commit_lsn > through):
                break
            want.append(t)
            nbytes += t.nbytes
        got = [t for t, _ in f.asm.take_ready(max_bytes, max_txns, through=through)]
        assert got == want
        ready = ready[len(want) :]
        backlog = f.asm.backlog()
        assert (backlog.transactions, backlog.nbytes) == (len(ready), sum(t.nbytes for t in ready))


def test_a_completed_batch_moves_the_flush_lsn_past_all_of_it() -> None:
    p = Progress(Lsn(5))
    items = p.add_many([Lsn(10 + i) for i in range(1000)])
    later = p.add(5000, done=False)
    p.mark_done(items[:400])
    assert p.flushed == 409
    assert isinstance(p.flushed, Lsn)
    p.mark_done(items[400:])
    assert p.flushed == 1009
    assert p.pending == 1
    p.mark_done([later])
    assert p.flushed == 5000
    assert p.pending == 0


@pytest.mark.parametrize("seed", range(6))
def test_feed_frames_of_small_transactions_is_feed_of_each_frame(tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    want, got = _fed_both_ways(tmp_path, rnd, _small_transactions(rnd), 300)
    assert len(want) > 300
    assert got == want


def test_feed_frames_reports_a_short_change_where_it_is(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    good = _frames([m.Begin(2000, 0, 1), rel(None), row(1)])
    bad = memoryview(XLogData(7777, 7780, 0, b"I\x00\x00").encode())
    with pytest.raises(ProtocolError) as err:
        f.asm.feed_frames([fr for _, fr in good] + [bad], XLOG_DATA_HEADER.size)
    assert err.value.context["lsn"] == 7777 and err.value.context["xid"] == 1
    assert "too short" in str(err.value)


# -- what the assembler tells the stager --------------------------------------------------


class RecordingStager:
    """A stager that stages nothing and records what it was told."""

    def __init__(self, stage_bytes: int) -> None:
        self.stage_bytes = stage_bytes
        self.holding = False
        self.calls: list[tuple[object, ...]] = []

    def chunk_closed(self, chunk: ClosedChunk) -> None:
        at = chunk.relations_at(chunk.end)
        self.calls.append(("chunk", chunk.xid, chunk.end, tuple(r.relation_id for r in at)))

    def truncated(self, xid: int, offset: int) -> None:
        self.calls.append(("truncated", xid, offset))

    def dropped(self, xid: int, *, for_good: bool = False) -> None:
        self.calls.append(("dropped", xid, for_good))

    def committed(self, xid: int, path: str, end: int, at: object) -> None:
        self.calls.append(("committed", xid, end))

    def holds(self, xid: int) -> bool:
        return self.holding

    def prepared(self, xid: int, path: str) -> bool:
        self.calls.append(("prepared", xid))
        if self.holding:  # as the stager does once its pieces are done
            Path(path).unlink()
        return self.holding

    def commit_prepared(self, xid: int, path: str, end: int, relations: object) -> None:
        self.calls.append(("commit_prepared", xid, end))

    def rolled_back(self, xid: int) -> None:
        self.calls.append(("rolled_back", xid))


def _staged_feed(tmp_path: Path, stage_bytes: int = 1 << 30) -> tuple[Feed, RecordingStager]:
    f = Feed(tmp_path)
    stager = RecordingStager(stage_bytes)
    f.asm.stager = stager
    return f, stager


def test_the_stager_hears_of_chunks_aborts_and_the_commit(tmp_path: Path) -> None:
    f, st = _staged_feed(tmp_path)
    f(m.StreamStart(10, True), rel(10), row(1, 10), m.StreamStop())
    f(m.StreamStart(10, False), row(2, 11), row(3, 11), m.StreamStop())
    f(m.StreamAbort(10, 11, 1, 0))
    f(m.StreamCommit(10, 0, 5000, 5010, 0))
    kinds = [c[0] for c in st.calls]
    assert kinds == ["chunk", "chunk", "truncated", "committed"], st.calls
    chunk1, chunk2, cut, done = st.calls
    assert chunk1[3] == (100,)  # the relation is described by the chunk's end
    assert int(str(cut[2])) == chunk1[2]  # subxact 11 started where chunk 1 ended
    assert int(str(done[2])) == chunk1[2]  # and the commit ends there
    assert int(str(chunk2[2])) > int(str(chunk1[2]))


def test_top_abort_ddl_and_two_phase_reach_the_stager(tmp_path: Path) -> None:
    f, st = _staged_feed(tmp_path)
    f(m.StreamStart(10, True), rel(10), row(1, 10), m.StreamStop(), m.StreamAbort(10, 10, 1, 0))
    changed = m.Relation(
        20, 100, "public", "t", "d", (*REL.columns, m.RelationColumn(0, "w", 23, -1))
    )
    f(m.StreamStart(20, True), rel(20), row(1, 20), changed, m.StreamStop())
    f(m.StreamPrepare(0, 6000, 6010, 0, 20, "g"))
    f(m.CommitPrepared(0, 6100, 6110, 0, 20, "g"))
    f(m.RollbackPrepared(0, 6200, 6210, 0, 0, 21, "h"))
    kinds = [c for c in st.calls if c[0] != "chunk"]
    assert kinds[0] == ("dropped", 10, False)
    assert ("dropped", 20, True) in kinds  # a second, different RELATION: DDL inside
    assert ("prepared", 20) in kinds
    assert [c[0] for c in kinds[-2:]] == ["commit_prepared", "rolled_back"]


def test_a_stream_prepare_is_durable_before_the_stager_may_drop_the_spool(
    tmp_path: Path,
) -> None:
    # The stager removes the stream spool once its pieces are done, possibly at once:
    # the prepared store must hold its own link by then (a CI run lost the file).
    f, st = _staged_feed(tmp_path)
    st.holding = True
    f(m.StreamStart(20, True), rel(20), row(1, 20), row(2, 20), m.StreamStop())
    f(m.StreamPrepare(0, 6000, 6010, 0, 20, "g"))
    assert ("prepared", 20) in st.calls
    g = Feed(tmp_path)  # a new process: spool wiped, prepared store kept
    g(m.CommitPrepared(0, 6100, 6110, 0, 20, "g"))
    (txn,) = g.take()
    assert (txn.kind, g.values(txn)) == ("prepared", [1, 2])


def test_a_long_chunk_is_offered_before_its_stream_stop(tmp_path: Path) -> None:
    f, st = _staged_feed(tmp_path, stage_bytes=100)
    frames = _frames([m.StreamStart(10, True), rel(10), *(row(i, 10) for i in range(40))])
    for i in range(0, len(frames), 5):  # offered at the end of a receive burst
        f.asm.feed_frames([fr for _, fr in frames[i : i + 5]], XLOG_DATA_HEADER.size)
    offers = [c for c in st.calls if c[0] == "chunk"]
    assert len(offers) >= 3  # and no STREAM STOP yet
    ends = [int(str(c[2])) for c in offers]
    assert all(b - a >= 100 for a, b in itertools.pairwise(ends))


def test_feed_frames_leaves_wrong_begins_and_commits_to_the_decoder(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    begin = _frames([m.Begin(2000, 0, 1)])[0][1]
    with pytest.raises(ProtocolError, match="still open"):
        f.asm.feed_frames([begin, begin], XLOG_DATA_HEADER.size)
    flagged = bytearray(_frames([m.Commit(0, 1990, 2000, 0)])[0][1])
    flagged[XLOG_DATA_HEADER.size + 1] = 1  # COMMIT flags must be 0
    with pytest.raises(ProtocolError, match="flags"):
        f.asm.feed_frames([memoryview(bytes(flagged))], XLOG_DATA_HEADER.size)
    assert f.asm.in_transaction  # the bad COMMIT ended nothing
