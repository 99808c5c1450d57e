"""The column-wise read of a burst's whole transactions, on encoded frames (no server)."""

from __future__ import annotations

import random

from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.burst import frame_tags, whole_run
from sparkapply.pgoutput.frames import XLOG_DATA_HEADER, XLogData

HEADER = XLOG_DATA_HEADER.size
TUP = m.TupleData(b"t", (b"1",))
REL = m.Relation(None, 100, "public", "t", "d", (m.RelationColumn(1, "id", 23, -1),))


def frames(msgs: list[m.Message]) -> list[memoryview]:
    return [
        memoryview(XLogData(10 * n, 10 * n + 5, 0, encode(msg)).encode())
        for n, msg in enumerate(msgs)
    ]


def txn(xid: int, *changes: m.Message, lsn: int = 0) -> list[m.Message]:
    lsn = lsn or 1000 * xid
    return [m.Begin(lsn, 7, xid), *changes, m.Commit(0, lsn, lsn + 40, 7 + xid)]


def scan(msgs: list[m.Message], start: int = 0, described: tuple[int, ...] = (100, 200)):  # type: ignore[no-untyped-def]
    fs = frames(msgs)
    return whole_run(fs, frame_tags(fs, HEADER), start, HEADER, described)


def messages(run) -> list[bytes]:  # type: ignore[no-untyped-def]
    """The run's change messages: its joined frames cut at their sizes, less heads."""
    ends = run.change_sizes.cumsum().tolist()
    starts = [0, *ends[:-1]]
    return [bytes(run.changes[a + HEADER : b]) for a, b in zip(starts, ends, strict=True)]


def test_a_run_reads_every_field_of_its_transactions() -> None:
    ins, upd = m.Insert(None, 100, TUP), m.Update(None, 200, None, None, TUP)
    dele = m.Delete(None, 100, "K", TUP)
    msgs = [*txn(5, ins, upd), *txn(6), *txn(7, dele), m.Begin(9000, 0, 9)]
    run = scan(msgs)
    assert run is not None and len(run) == 3
    assert (run.start, run.end) == (0, 9)  # the open transaction at the end is not taken
    assert run.xids == [5, 6, 7]
    assert run.commit_lsns == [5000, 6000, 7000]
    assert run.end_lsns == [5040, 6040, 7040]
    assert run.commit_times == [12, 13, 14]
    assert run.bounds == [0, 2, 2, 3]  # an empty transaction has no change
    assert run.relation_ids == [100, 200, 100]
    assert run.change_tags == b"IUD"
    assert messages(run) == [encode(c) for c in (ins, upd, dele)]


def test_a_run_starts_where_asked_and_stops_before_what_it_cannot_vouch_for() -> None:
    ins = m.Insert(None, 100, TUP)
    cases: dict[str, list[m.Message]] = {
        "a RELATION inside": txn(8, REL, ins),
        "a relation not described yet": txn(8, m.Insert(None, 300, TUP)),
        "a TRUNCATE inside": txn(8, m.Truncate(None, 0, (100,))),
        "a logical message inside": txn(8, m.LogicalMessage(None, 1, 0, "p", b"x")),
        "a streamed chunk after": [m.StreamStart(8, True), m.Insert(8, 100, TUP)],
    }
    for what, rest in cases.items():
        msgs = [m.Begin(1, 0, 1), m.Commit(0, 1, 2, 3), *txn(6, ins), *txn(7, ins), *rest]
        run = scan(msgs, start=2)
        assert run is not None, what
        assert (run.start, run.end, run.xids) == (2, 8, [6, 7]), what
        assert scan(msgs, start=8) is None, what


def test_a_wrong_size_or_flag_ends_the_run_at_its_transaction() -> None:
    """The transaction with a malformed message is left to the general path, which
    reports it; those before it are taken."""
    msgs = [*txn(6, m.Insert(None, 100, TUP)), *txn(7, m.Insert(None, 100, TUP))]
    good = frames(msgs)
    short_change = bytes(good[4])[: HEADER + 7]  # less than a change's head
    long_begin = bytes(good[3]) + b"\0"
    flagged = bytearray(good[5])
    flagged[HEADER + 1] = 1
    for bad_at, bad in ((4, short_change), (3, long_begin), (5, bytes(flagged))):
        fs = [*good[:bad_at], memoryview(bad), *good[bad_at + 1 :]]
        run = whole_run(fs, frame_tags(fs, HEADER), 0, HEADER, (100,))
        assert run is not None and run.xids == [6] and run.end == 3


def test_a_frame_without_a_message_matches_nothing() -> None:
    fs = [*frames(txn(6)), memoryview(bytes(frames(txn(7))[0])[:HEADER])]
    tags = frame_tags(fs, HEADER)
    assert tags == b"BC\0"
    run = whole_run(fs, tags, 0, HEADER, ())
    assert run is not None and run.xids == [6]
    assert whole_run(fs, tags, 2, HEADER, ()) is None


def test_fields_are_read_from_frames_of_any_size_and_up_to_an_unknown_relation() -> None:
    # Changes of many sizes, so each field is found at its own offset in the frames
    # joined; a transaction on relation 300 (not described) ends the run before it.
    rng = random.Random(18)
    msgs: list[m.Message] = []
    expected: list[tuple[int, list[int], list[bytes]]] = []
    for xid in range(1, 40):
        changes: list[m.Insert] = []
        for _ in range(rng.randrange(0, 5)):
            value = b"x" * rng.randrange(0, 300)
            rel = rng.choice((100, 200))
            changes.append(m.Insert(None, rel, m.TupleData(b"t", (value,))))
        expected.append((xid, [c.relation_id for c in changes], [encode(c) for c in changes]))
        msgs += txn(xid, *changes)
    cut = len(msgs)
    msgs += txn(99, m.Insert(None, 300, TUP)) + txn(100, m.Insert(None, 100, TUP))
    run = scan(msgs)
    assert run is not None and run.end == cut
    assert run.xids == [x for x, _, _ in expected]
    assert run.commit_lsns == [1000 * x for x, _, _ in expected]
    assert run.relation_ids == [r for _, rels, _ in expected for r in rels]
    assert messages(run) == [b for _, _, bs in expected for b in bs]
    assert run.bounds[-1] == len(run.relation_ids)
