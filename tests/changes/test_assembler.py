"""The assembler on encoded messages: no server, exact state transitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkapply.changes.assembler import Assembler
from sparkapply.changes.prepared import PreparedStore
from sparkapply.changes.progress import Progress
from sparkapply.changes.spool import read_records
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.errors import ProtocolError, StateError
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m

REL = m.Relation(None, 100, "public", "t", "d", (m.RelationColumn(1, "id", 23, -1),))


def row(v: int, xid: int | None = None) -> m.Insert:
    return m.Insert(xid, 100, m.TupleData(b"t", (str(v).encode(),)))


def rel(xid: int | None) -> m.Relation:
    return m.Relation(xid, REL.relation_id, REL.namespace, REL.name, "d", REL.columns)


class Feed:
    def __init__(self, tmp_path: Path) -> None:
        self.progress = Progress(Lsn(0))
        self.store = PreparedStore(tmp_path / "prepared")
        self.asm = Assembler(
            tmp_path,
            proto_version=4,
            streaming="parallel",
            prepared=self.store,
            progress=self.progress,
        )
        self.lsn = 1000

    def __call__(self, *msgs: m.Message) -> None:
        for msg in msgs:
            self.lsn += 10
            self.asm.feed(encode(msg), self.lsn)

    def take(self) -> list[CommittedTxn]:
        """What the subscriber would hand to the apply (flushes the spool)."""
        return [t for t, _ in self.asm.take_ready(1 << 30, 1000)]

    @staticmethod
    def values(txn: CommittedTxn) -> list[int]:
        out = []
        for seg in txn.segments:
            for payload, in_stream in read_records(seg):
                if payload[:1] == b"I":
                    off = 9 if in_stream else 5
                    # Insert: [xid] relid 'N' ncols(2) kind(1) len(4) value
                    n = int.from_bytes(payload[off + 4 : off + 8], "big")
                    out.append(int(payload[off + 8 : off + 8 + n]))
        return out


def test_ordinary_transactions_in_commit_order(tmp_path: Path) -> None:
    f = Feed(tmp_path)
    f(m.Begin(2000, 0, 1), rel(None), row(1), m.Commit(0, 1990, 2000, 0))
    f(m.Begin(3000, 0, 2), row(2), row(3), m.Commit(0, 2990, 3000, 0))
    txns = f.take()
    assert [t.xid for t in txns] == [1, 2]
    assert f.values(txns[0]) == [1] and f.values(txns[1]) == [2, 3]
    assert txns[1].relations[100] == REL  # cache carried to a later txn
    assert f.progress.flushed == 0  # nothing durable yet


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
    tags = [p[:1] for s in txn.segments for p, _ in read_records(s)]
    assert tags == [b"R"]


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
