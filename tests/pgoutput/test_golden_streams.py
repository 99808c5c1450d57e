"""The decoder against real bytes, continued: streamed and two-phase transactions,
older protocol versions, and the saved fixture (see test_golden.py)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from sparkapply.lsn import Lsn
from sparkapply.pgoutput import messages as m
from tests.pgoutput import capture
from tests.pgoutput.capture import PgoutputCapture, connect, current_lsn, current_xid, row_xmin
from tests.pgoutput.capture_file import read_capture
from tests.pgoutput.golden import decode, kinds, of, one, server_clock, stream_segments, tup
from tests.pgoutput.test_capture_fixture import FIXTURE, check_representative

# -- Streaming -------------------------------------------------------------------------


def test_streamed_commit_with_subtransaction_aborts(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute(
            """
            CREATE TYPE mood AS ENUM ('sad', 'happy');
            CREATE TABLE t (id int PRIMARY KEY, m mood);
            CREATE TABLE side (id int);
            """
        )
        cap.setup()
        t0 = server_clock(w)
        with w.transaction():
            top = current_xid(w)
            w.execute("INSERT INTO t VALUES (1, 'happy')")
            w.execute("SAVEPOINT a")
            # NULL moods: see test_stream_abort_of_a_subtransaction_never_streamed.
            w.execute("INSERT INTO t VALUES (2, NULL)")
            sub_a = row_xmin(w, "t", "id = 2")
            w.execute("SAVEPOINT b")
            w.execute("INSERT INTO t VALUES (3, NULL)")
            sub_b = row_xmin(w, "t", "id = 3")
            before_abort = current_lsn(w)
            w.execute("ROLLBACK TO SAVEPOINT a")  # aborts b, then a; a starts again (a2)
            after_abort = current_lsn(w)
            w.execute("SAVEPOINT c")
            w.execute("INSERT INTO t VALUES (4, 'happy')")
            sub_c = row_xmin(w, "t", "id = 4")
            w.execute("RELEASE SAVEPOINT c")
            w.execute("TRUNCATE side")
            msg_lsn = w.execute("SELECT pg_logical_emit_message(true, 'p', 'c')::text").fetchone()
            w.execute("INSERT INTO t VALUES (5, 'sad')")
            sub_a2 = row_xmin(w, "t", "id = 5")
        t1 = server_clock(w)
        assert msg_lsn is not None
        assert len({top, sub_a, sub_b, sub_c, sub_a2}) == 5
        records = cap.read(decoding="immediate")
    msgs = decode(records)
    assert not of(msgs, m.Begin) and not of(msgs, m.Commit)
    segments = stream_segments(msgs)
    in_stream = [x for seg in segments for x in seg]
    outside = [x for x in msgs if not any(x is y for y in in_stream)]
    assert kinds(outside) == ["StreamAbort", "StreamAbort", "StreamCommit"]

    starts = of(msgs, m.StreamStart)
    assert len(segments) == len(starts) == len(of(msgs, m.StreamStop)) >= 5
    assert [s.first_segment for s in starts] == [True] + [False] * (len(starts) - 1)
    assert {s.xid for s in starts} == {top}

    # Each change carries the xid of the (sub)transaction that made it.
    inserts = of(msgs, m.Insert)
    assert [(i.new.values[0], i.xid) for i in inserts] == [
        (b"1", top),
        (b"2", sub_a),
        (b"3", sub_b),
        (b"4", sub_c),
        (b"5", sub_a2),
    ]
    for x in in_stream:
        if isinstance(x, m.Relation | m.Type):
            assert x.xid in (top, sub_a, sub_b, sub_c, sub_a2)
    assert of(msgs, m.Type)[0].xid == top
    trunc = one(msgs, m.Truncate)
    assert trunc.xid == sub_a2 and trunc.options == 0
    # A transactional message is attributed to the top transaction.
    msg = one(msgs, m.LogicalMessage)
    assert msg == m.LogicalMessage(top, 1, Lsn.parse(msg_lsn[0]), "p", b"c")

    abort_b, abort_a = of(msgs, m.StreamAbort)
    commit = one(msgs, m.StreamCommit)
    assert (abort_b.xid, abort_b.subxid) == (top, sub_b)
    assert (abort_a.xid, abort_a.subxid) == (top, sub_a)
    for ab in (abort_b, abort_a):
        assert ab.abort_lsn is not None and ab.abort_time is not None
        assert before_abort < ab.abort_lsn <= after_abort
        assert t0 <= ab.abort_time <= commit.commit_time
    assert abort_b.abort_lsn is not None and abort_a.abort_lsn is not None
    assert abort_b.abort_lsn < abort_a.abort_lsn
    assert commit.xid == top and commit.flags == 0
    assert after_abort < commit.commit_lsn < commit.end_lsn
    assert t0 <= commit.commit_time <= t1


def _aborted_savepoint(w: psycopg.Connection[Any], kept: str, aborted: str) -> tuple[int, int]:
    """In the open transaction: row 1 (``kept``), then row 2 (``aborted``) in a savepoint
    that is rolled back; the top xid and the savepoint's."""
    top = current_xid(w)
    w.execute(sql.SQL("INSERT INTO t VALUES (1, {})").format(sql.Literal(kept)))
    w.execute("SAVEPOINT a")
    w.execute(sql.SQL("INSERT INTO t VALUES (2, {})").format(sql.Literal(aborted)))
    sub = row_xmin(w, "t", "id = 2")
    w.execute("ROLLBACK TO SAVEPOINT a")
    return top, sub


def test_stream_abort_of_a_subtransaction_never_streamed(pg_dsn: str) -> None:
    """PostgreSQL skips changes of a subtransaction that is already aborted when decoding
    needs a catalog lookup for them (here: the output function of an enum label not yet
    cached), leaving an empty segment; its Stream Abort still comes. Subscribers must
    accept empty segments and aborts of subxids they never saw."""
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        w.execute("CREATE TABLE t (id int PRIMARY KEY, m mood)")
        cap.setup()
        with w.transaction():
            top, sub = _aborted_savepoint(w, "happy", "sad")
        msgs = decode(cap.read(decoding="immediate"))
    assert kinds(msgs) == [
        *["StreamStart", "Type", "Relation", "Insert", "StreamStop"],
        *["StreamStart", "StreamStop"],
        *["StreamAbort", "StreamCommit"],
    ]
    assert one(msgs, m.Insert).xid == top
    assert of(msgs, m.StreamStart)[1] == m.StreamStart(top, False)
    abort = one(msgs, m.StreamAbort)
    assert (abort.xid, abort.subxid) == (top, sub)


def test_streamed_large_transactions_commit_and_abort(pg_dsn: str) -> None:
    """Streamed because they pass logical_decoding_work_mem (64kB), not by the debug GUC."""
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cap.setup()
        w.execute("INSERT INTO t VALUES (0, 'small')")  # not streamed
        with w.transaction():
            big_xid = current_xid(w)
            w.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g")
        w.execute("BEGIN")
        aborted_xid = current_xid(w)
        w.execute("UPDATE t SET v = 'y' WHERE id > 0")
        before = current_lsn(w)
        w.execute("ROLLBACK")
        after = current_lsn(w)
        msgs = decode(cap.read(decoding="buffered", work_mem="64kB"))
    begin = one(msgs, m.Begin)
    assert begin.xid not in (big_xid, aborted_xid)
    assert kinds(msgs)[:5] == ["Begin", "Relation", "Insert", "Commit", "StreamStart"]
    starts = of(msgs, m.StreamStart)
    by_xid: dict[int, list[m.StreamStart]] = {}
    for s in starts:
        by_xid.setdefault(s.xid, []).append(s)
    assert set(by_xid) == {big_xid, aborted_xid}
    for segs in by_xid.values():
        assert len(segs) >= 2
        assert [s.first_segment for s in segs] == [True] + [False] * (len(segs) - 1)
    inserts = [x for x in of(msgs, m.Insert) if x.xid is not None]
    assert len(inserts) == 2000 and {i.xid for i in inserts} == {big_xid}
    updates = of(msgs, m.Update)
    assert updates and {u.xid for u in updates} == {aborted_xid}
    commit = one(msgs, m.StreamCommit)
    assert commit.xid == big_xid
    abort = one(msgs, m.StreamAbort)
    assert (abort.xid, abort.subxid) == (aborted_xid, aborted_xid)
    assert abort.abort_lsn is not None and before < abort.abort_lsn <= after
    assert abort.abort_time is not None and abort.abort_time >= commit.commit_time
    assert isinstance(msgs[-1], m.StreamAbort)


def test_stream_abort_without_parallel_has_no_abort_lsn(pg_dsn: str) -> None:
    """With streaming 'on' the same abort is 9 bytes shorter: no LSN, no time."""
    with (
        connect(pg_dsn) as w,
        PgoutputCapture(pg_dsn, options=capture.CaptureOptions(streaming="on")) as cap,
    ):
        w.execute("CREATE TABLE t (id int)")
        cap.setup()
        w.execute("BEGIN")
        xid = current_xid(w)
        w.execute("INSERT INTO t VALUES (1)")
        w.execute("ROLLBACK")
        records = cap.read(decoding="immediate")
    assert [len(r.payload) for r in records if r.tag == "A"] == [9]
    abort = one(decode(records, streaming="on"), m.StreamAbort)
    assert abort == m.StreamAbort(xid, xid, None, None)


# -- Two-phase -------------------------------------------------------------------------


def _prepare(w: psycopg.Connection[Any], gid: str, value: int) -> int:
    w.execute("BEGIN")
    xid = current_xid(w)
    w.execute("INSERT INTO t VALUES (%s)", (value,))
    w.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    return xid


def _finish(w: psycopg.Connection[Any], how: str, gid: str) -> None:
    w.execute(sql.SQL(how + " PREPARED {}").format(sql.Literal(gid)))


def test_two_phase_commit_rollback_reused_and_empty_gid(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TABLE t (id int)")
        cap.setup()
        t0 = server_clock(w)
        x1 = _prepare(w, "gid-1", 1)
        _finish(w, "COMMIT", "gid-1")
        x2 = _prepare(w, "gid-1", 2)  # the same gid again
        _finish(w, "ROLLBACK", "gid-1")
        x3 = _prepare(w, "", 3)  # PostgreSQL allows an empty gid
        x4 = _prepare(w, "other", 4)  # prepared while '' still is
        _finish(w, "ROLLBACK", "")
        _finish(w, "COMMIT", "other")
        t1 = server_clock(w)
        msgs = decode(cap.read())
    assert kinds(msgs) == [
        *["BeginPrepare", "Relation", "Insert", "Prepare", "CommitPrepared"],
        *["BeginPrepare", "Insert", "Prepare", "RollbackPrepared"],
        *["BeginPrepare", "Insert", "Prepare"],
        *["BeginPrepare", "Insert", "Prepare", "RollbackPrepared", "CommitPrepared"],
    ]
    bps, ps = of(msgs, m.BeginPrepare), of(msgs, m.Prepare)
    assert [(b.xid, b.gid) for b in bps] == [(x1, "gid-1"), (x2, "gid-1"), (x3, ""), (x4, "other")]
    for b, p in zip(bps, ps, strict=True):
        assert (b.prepare_lsn, b.end_lsn, b.prepare_time, b.xid, b.gid) == (
            p.prepare_lsn,
            p.end_lsn,
            p.prepare_time,
            p.xid,
            p.gid,
        )
        assert p.flags == 0 and p.prepare_lsn < p.end_lsn
        assert t0 <= p.prepare_time <= t1
    assert [i.new for i in of(msgs, m.Insert)] == [tup(b"1"), tup(b"2"), tup(b"3"), tup(b"4")]
    cp1, cp4 = of(msgs, m.CommitPrepared)
    rp2, rp3 = of(msgs, m.RollbackPrepared)
    assert (cp1.xid, cp1.gid, cp1.flags) == (x1, "gid-1", 0)
    assert ps[0].end_lsn <= cp1.commit_lsn < cp1.end_lsn
    assert ps[0].prepare_time <= cp1.commit_time <= t1
    assert (cp4.xid, cp4.gid) == (x4, "other")
    assert cp4.commit_lsn >= rp3.rollback_end_lsn
    assert (rp2.xid, rp2.gid, rp2.flags) == (x2, "gid-1", 0)
    assert (rp3.xid, rp3.gid) == (x3, "")
    for rp, p in ((rp2, ps[1]), (rp3, ps[2])):
        assert rp.prepare_end_lsn == p.end_lsn
        assert rp.prepare_time == p.prepare_time
        assert rp.rollback_end_lsn > rp.prepare_end_lsn
        assert p.prepare_time <= rp.rollback_time <= t1
    # xids ascend with gids repeating: the xid, not the gid, names a prepared transaction.
    assert x1 < x2 < x3 < x4


def test_stream_prepare(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TABLE t (id int)")
        cap.setup()
        x1 = _prepare(w, "sp", 1)
        w.execute("INSERT INTO t VALUES (10)")  # a plain transaction in between
        _finish(w, "COMMIT", "sp")
        x2 = _prepare(w, "sp", 2)
        _finish(w, "ROLLBACK", "sp")
        msgs = decode(cap.read(decoding="immediate"))
    assert kinds(msgs) == [
        *["StreamStart", "Relation", "Insert", "StreamStop", "StreamPrepare"],
        *["StreamStart", "Relation", "Insert", "StreamStop", "StreamCommit"],
        "CommitPrepared",
        *["StreamStart", "Relation", "Insert", "StreamStop", "StreamPrepare"],
        "RollbackPrepared",
    ]
    sp1, sp2 = of(msgs, m.StreamPrepare)
    s1, s_plain, s2 = of(msgs, m.StreamStart)
    assert (s1.xid, s1.first_segment, s2.xid, s2.first_segment) == (x1, True, x2, True)
    assert s_plain.xid not in (x1, x2)
    assert [(i.xid, i.new) for i in of(msgs, m.Insert)] == [
        (x1, tup(b"1")),
        (s_plain.xid, tup(b"10")),
        (x2, tup(b"2")),
    ]
    assert (sp1.xid, sp1.gid, sp1.flags) == (x1, "sp", 0)
    assert (sp2.xid, sp2.gid) == (x2, "sp")
    assert sp1.prepare_lsn < sp1.end_lsn < sp2.prepare_lsn < sp2.end_lsn
    cp, rp = one(msgs, m.CommitPrepared), one(msgs, m.RollbackPrepared)
    assert (cp.xid, cp.gid) == (x1, "sp") and cp.commit_lsn >= sp1.end_lsn
    assert (rp.xid, rp.gid) == (x2, "sp")
    assert (rp.prepare_end_lsn, rp.prepare_time) == (sp2.end_lsn, sp2.prepare_time)


# -- Older protocol versions -----------------------------------------------------------


@pytest.mark.parametrize(
    ("proto_version", "streaming", "two_phase"),
    [(1, "off", False), (2, "on", False), (3, "on", True), (4, "on", True)],
)
def test_older_protocols(
    pg_dsn: str, proto_version: int, streaming: capture.StreamingOption, two_phase: bool
) -> None:
    options = capture.CaptureOptions(
        proto_version=proto_version, streaming=streaming, two_phase=two_phase
    )
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn, options=options) as cap:
        w.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cap.setup()
        with w.transaction():
            xid, sub = _aborted_savepoint(w, "a", "b")
            w.execute("SELECT pg_logical_emit_message(true, 'p', 'x')")
        prepared = _prepare(w, "g", 3) if two_phase else None
        if two_phase:
            _finish(w, "COMMIT", "g")
        records = cap.read(decoding="immediate")
    msgs = decode(records, streaming, proto_version)
    if streaming == "off":
        assert kinds(msgs) == ["Begin", "Relation", "Insert", "LogicalMessage", "Commit"]
        assert one(msgs, m.Begin).xid == xid
        assert one(msgs, m.LogicalMessage).xid is None
        return
    outside = [x for x in msgs if isinstance(x, m.StreamAbort | m.StreamCommit | m.StreamPrepare)]
    expected = ["StreamAbort", "StreamCommit"] + (["StreamPrepare"] if two_phase else [])
    assert kinds(outside) == expected
    abort = one(msgs, m.StreamAbort)
    assert abort == m.StreamAbort(xid, sub, None, None)  # no abort LSN/time before 'parallel'
    assert one(msgs, m.StreamCommit).xid == xid
    assert [i.xid for i in of(msgs, m.Insert)] == [xid, sub] + ([prepared] if prepared else [])
    if prepared is not None:
        assert (one(msgs, m.StreamPrepare).gid, one(msgs, m.CommitPrepared).xid) == ("g", prepared)


# -- The saved fixture -----------------------------------------------------------------


def test_representative_workload_matches_saved_fixture(pg_dsn: str) -> None:
    """The workload of tests/fixtures/pgoutput_capture.bin still produces that shape."""
    live = capture.representative_workload(pg_dsn)
    live_msgs = decode(live.records, live.header["streaming"])
    check_representative(live.header, live_msgs)
    saved = read_capture(FIXTURE)
    saved_msgs = decode(saved.records, saved.header["streaming"])
    assert kinds(live_msgs) == kinds(saved_msgs)
    assert [r.tag for r in live.records] == [r.tag for r in saved.records]
