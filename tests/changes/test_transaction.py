"""What a batch's transactions name, read once per shared mapping (no server)."""

from __future__ import annotations

from pathlib import Path

from sparkapply.changes.transaction import relations_named
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.frames import XLOG_DATA_HEADER
from tests.changes.feed import Feed
from tests.changes.test_assembler import REL, REL2, REL2B, _frames, row


def _update(relid: int) -> m.Update:
    return m.Update(None, relid, None, None, m.TupleData(b"t", (b"1",)))


def test_relations_named_are_each_relation_once_in_the_order_first_named(
    tmp_path: Path,
) -> None:
    # Transactions received whole share their cache entries; a RELATION inside a
    # transaction (REL2B: the table altered) is named by it, and the transactions
    # after it have the new entry.
    msgs: list[m.Message] = [m.Begin(1000, 0, 1), REL2, _update(200), m.Commit(0, 1000, 1010, 0)]
    for xid in range(2, 6):
        msgs += [m.Begin(1000 * xid, 0, xid), row(xid), _update(200)]
        msgs += [m.Commit(0, 1000 * xid, 1000 * xid + 10, 0)]
    msgs += [m.Begin(9000, 0, 9), REL2B, _update(200), m.Commit(0, 9000, 9010, 0)]
    msgs += [m.Begin(9500, 0, 10), _update(200), row(10), m.Commit(0, 9500, 9510, 0)]
    f = Feed(tmp_path)
    f.asm.relations[REL.relation_id] = REL
    f.asm.feed_frames([fr for _, fr in _frames(msgs)], XLOG_DATA_HEADER.size)
    batch = f.take()
    assert [t.xid for t in batch] == [1, 2, 3, 4, 5, 9, 10]
    assert batch[2].relations is batch[1].relations  # shared: the planner's saving
    assert batch[-1].relations == {100: REL, 200: REL2B}
    named = relations_named(batch)
    assert named == [REL2, REL, REL2B]
    assert named[0] is batch[1].relations[200] and named[2] is batch[-1].relations[200]
    assert sorted(relations_named(batch[1:5]), key=lambda r: r.relation_id) == [REL, REL2]
