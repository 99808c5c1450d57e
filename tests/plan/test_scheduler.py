"""The batch scheduler on a real assembler fed encoded messages: no server, no Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkapply.changes.cut_requests import CutRequests
from sparkapply.changes.skip import SkipStore
from sparkapply.config import ApplyConfig
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import messages as m
from sparkapply.plan.scheduler import Batch, BatchScheduler
from tests.changes.feed import Feed
from tests.changes.test_assembler import rel, row


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def txn(f: Feed, xid: int, commit: int, *values: int, first: bool = False) -> None:
    msgs: list[m.Message] = [m.Begin(commit, 0, xid)]
    if first:
        msgs.append(rel(None))
    msgs += [row(v) for v in values]
    msgs.append(m.Commit(0, commit, commit + 10, 0))
    f(*msgs)


def make(
    tmp_path: Path,
    *,
    linger: float = 1.0,
    max_txns: int = 100,
    skips: bool = False,
    requests: CutRequests | None = None,
) -> tuple[Feed, BatchScheduler, Clock]:
    f = Feed(tmp_path)
    clock = Clock()
    limits = ApplyConfig(
        batch_max_bytes=1 << 30, batch_max_transactions=max_txns, batch_linger=linger
    )
    sched = BatchScheduler(
        f.asm,
        f.progress,
        limits,
        skips=SkipStore(tmp_path) if skips else None,
        prepared=f.store,
        clock=clock,
        cut_requests=requests,
    )
    return f, sched, clock


def cut_after(sched: BatchScheduler, clock: Clock, seconds: float = 0.0) -> Batch | None:
    """``seconds`` later, frames came in: the batch the scheduler cuts, if any."""
    clock.now += seconds
    sched.received(True)
    return sched.cut()


def cut_now(sched: BatchScheduler, *, frames: bool = True) -> Batch:
    """The batch the scheduler cuts now (there must be one)."""
    sched.received(frames)
    batch = sched.cut()
    assert batch is not None
    return batch


def xids(batch: Batch | None) -> list[int] | None:
    return None if batch is None else [t.xid for t in batch.txns]


def test_a_batch_waits_for_linger_while_frames_keep_coming(tmp_path: Path) -> None:
    f, sched, clock = make(tmp_path, linger=1.0)
    txn(f, 1, 2000, 1, first=True)
    assert cut_after(sched, clock) is None
    assert cut_after(sched, clock, 0.5) is None
    assert xids(cut_after(sched, clock, 0.6)) == [1]


def test_a_pause_in_the_stream_cuts_at_once(tmp_path: Path) -> None:
    f, sched, _ = make(tmp_path, linger=60.0)
    txn(f, 1, 2000, 1, first=True)
    sched.received(False)
    batch = sched.cut()
    assert batch is not None and len(batch) == 1


def test_a_walsender_that_sent_everything_cuts_at_once(tmp_path: Path) -> None:
    # The burst brought frames, and the walsender's unasked keepalive after them said
    # it has nothing more: the end of a backlog, as good as a pause.
    f, sched, _ = make(tmp_path, linger=60.0)
    txn(f, 1, 2000, 1, first=True)
    sched.received(True, caught_up=False)
    assert sched.cut() is None
    sched.received(True, caught_up=True)
    assert xids(sched.cut()) == [1]


def test_a_full_batch_cuts_and_one_batch_runs_at_a_time(tmp_path: Path) -> None:
    f, sched, _ = make(tmp_path, linger=60.0, max_txns=2)
    txn(f, 1, 2000, 1, first=True)
    txn(f, 2, 3000, 2)
    txn(f, 3, 4000, 3)
    batch = cut_now(sched)
    assert xids(batch) == [1, 2]
    sched.received(False)
    assert sched.cut() is None  # the first is still running
    sched.complete(batch)
    nxt = sched.cut()
    assert nxt is not None and xids(nxt) == [3]


def test_durable_before_acknowledged(tmp_path: Path) -> None:
    f, sched, _ = make(tmp_path)
    txn(f, 1, 2000, 1, first=True)
    batch = cut_now(sched, frames=False)
    assert f.progress.flushed == 0  # cut is not durable
    assert not sched.idle()
    other = make(tmp_path / "other")[1]
    with pytest.raises(RuntimeError):
        other.complete(batch)
    sched.complete(batch)
    assert f.progress.flushed == 2010
    assert sched.idle()


def test_not_idle_while_a_transaction_is_half_received(tmp_path: Path) -> None:
    f, sched, _ = make(tmp_path)
    assert sched.idle()
    f(m.Begin(2000, 0, 1), rel(None), row(1))
    sched.received(True)
    assert not sched.idle() and sched.cut() is None
    f(m.Commit(0, 2000, 2010, 0))
    sched.received(False)
    assert not sched.idle()  # ready, not applied
    batch = sched.cut()
    assert batch is not None
    sched.complete(batch)
    assert sched.idle() and sched.caught_up(Lsn(2010)) and not sched.caught_up(Lsn(2011))


def test_stop_cuts_nothing_more_and_exits_after_the_running_batch(tmp_path: Path) -> None:
    f, sched, _ = make(tmp_path)
    txn(f, 1, 2000, 1, first=True)
    batch = cut_now(sched, frames=False)
    txn(f, 2, 3000, 2)
    sched.stop()
    assert not sched.may_exit()
    sched.complete(batch)
    sched.received(False)
    assert sched.cut() is None and sched.may_exit()
    assert f.progress.flushed == 2010  # the abandoned transaction is not acknowledged


def test_skip_drops_exactly_the_named_transaction(tmp_path: Path) -> None:
    f, sched, _ = make(tmp_path, skips=True)
    store = SkipStore(tmp_path)
    store.request(Lsn(3000))
    txn(f, 1, 2000, 1, first=True)
    txn(f, 2, 3000, 2)
    txn(f, 3, 4000, 3)
    batch = cut_now(sched, frames=False)
    assert xids(batch) == [1, 3]
    assert sched.skipped_through == 3010
    assert f.progress.flushed == 0  # transaction 1 is not durable yet
    sched.complete(batch)
    assert f.progress.flushed == 4010
    assert store.get() is not None  # kept until the server has been told
    sched.forget_skip()
    assert store.get() is None and not store.path.exists()


def test_skip_of_a_prepared_transaction_by_its_prepare_lsn(tmp_path: Path) -> None:
    f, sched, _ = make(tmp_path, skips=True)
    f(m.BeginPrepare(2000, 2010, 0, 7, "g"), rel(None), row(5), m.Prepare(0, 2000, 2010, 0, 7, "g"))
    SkipStore(tmp_path).request(Lsn(2000))
    txn(f, 8, 2500, 6)
    batch = cut_now(sched, frames=False)
    assert xids(batch) == [8]
    sched.complete(batch)
    assert SkipStore(tmp_path).get() is not None  # its COMMIT PREPARED is still to come
    f(m.CommitPrepared(0, 3000, 3010, 0, 7, "g"))
    sched.received(False)
    assert sched.cut() is None  # the only ready transaction was skipped
    assert f.store.xids() == [] and f.progress.flushed == 3010


def test_a_skip_lsn_the_stream_has_passed_is_dropped(tmp_path: Path) -> None:
    f, sched, _ = make(tmp_path, skips=True)
    SkipStore(tmp_path).request(Lsn(2500))
    txn(f, 1, 2000, 1, first=True)
    txn(f, 2, 3000, 2)
    sched.received(False)
    batch = sched.cut()
    assert batch is not None and len(batch) == 2
    assert SkipStore(tmp_path).get() is None and sched.skipped_through is None


def test_skip_store_is_durable_and_replaced(tmp_path: Path) -> None:
    store = SkipStore(tmp_path)
    assert store.get() is None
    store.request(Lsn.parse("1/A0"))
    store.request(Lsn.parse("1/B0"))
    assert SkipStore(tmp_path).get() == store.get()
    got = store.get()
    assert got is not None and str(got.lsn) == "1/B0"
    assert not store.clear(Lsn.parse("1/A0"))  # a newer request stays
    assert store.clear(Lsn.parse("1/B0")) and store.get() is None


def test_what_gathered_while_a_batch_ran_is_cut_when_it_completes(tmp_path: Path) -> None:
    """Group commit: under a steady stream (never a pause), the next batch does not wait
    a linger after the running one is durable."""
    f, sched, clock = make(tmp_path, linger=60.0)
    txn(f, 1, 2000, 1, first=True)
    first = cut_now(sched, frames=False)
    clock.now += 0.1
    txn(f, 2, 3000, 2)
    assert cut_after(sched, clock) is None  # one batch at a time
    clock.now += 0.2
    sched.complete(first)
    nxt = cut_after(sched, clock)
    assert nxt is not None and xids(nxt) == [2]
    sched.complete(nxt)
    # Ready after the last completion, with nothing running: it waits for the linger
    # (or a pause, or a full batch) to gather more.
    clock.now += 0.1
    txn(f, 3, 4000, 3)
    assert cut_after(sched, clock) is None
    assert xids(cut_after(sched, clock, 61.0)) == [3]


def test_a_batch_ends_at_a_requested_cut_and_an_empty_batch_records_it(tmp_path: Path) -> None:
    requests = CutRequests(tmp_path / "work", interval=0.0)
    f, sched, _ = make(tmp_path, linger=0.0, requests=requests)
    txn(f, 1, 2000, 1, first=True)
    txn(f, 2, 3000, 2)
    txn(f, 3, 4000, 3)
    requests.add(Lsn(3500))
    batch = cut_now(sched)
    assert xids(batch) == [1, 2]
    assert batch.requested is None
    sched.complete(batch)
    record = sched.cut()  # the next waiting is above the request: the cut is exact
    assert record is not None and record.requested == Lsn(3500) and not record.txns
    sched.complete(record)
    sched.cut_recorded(Lsn(3500))
    rest = sched.cut()
    assert rest is not None and xids(rest) == [3]


def test_not_caught_up_while_a_requested_cut_at_or_below_the_target_waits(
    tmp_path: Path,
) -> None:
    """A copy's cut (copy/commit.py) is asked for on the apply thread, of the object the
    scheduler holds: read at the next look, however long its interval, and a run
    until caught up records it before it leaves."""
    requests = CutRequests(tmp_path / "work", interval=3600.0)
    f, sched, _ = make(tmp_path, linger=0.0, requests=requests)
    txn(f, 1, 2000, 1, first=True)
    sched.complete(cut_now(sched))
    assert requests.pending() == [] and sched.caught_up(Lsn(2010))
    requests.add(Lsn(2005))
    assert not sched.caught_up(Lsn(2010))  # waits for it...
    assert sched.caught_up(Lsn(2004))  # ...not for one above the target
    record = sched.cut()
    assert record is not None and record.requested == Lsn(2005)
    sched.complete(record)
    sched.cut_recorded(Lsn(2005))
    assert sched.caught_up(Lsn(2010))


def test_nothing_above_a_hold_is_applied_until_it_goes(tmp_path: Path) -> None:
    """verify holds the mirror at the publisher's position while its slot becomes
    consistent at a point it does not know yet; then it asks for the exact cut."""
    requests = CutRequests(tmp_path / "work", interval=0.0)
    f, sched, _ = make(tmp_path, linger=0.0, requests=requests)
    txn(f, 1, 2000, 1, first=True)
    txn(f, 2, 3000, 2)
    hold = requests.hold(Lsn(2500), 60.0)
    batch = cut_now(sched)
    assert xids(batch) == [1]
    sched.complete(batch)
    txn(f, 3, 4000, 3)
    sched.received(False)
    assert sched.cut() is None  # held: neither 3000 nor 4000, and no cut is recorded
    requests.add(Lsn(3500))  # the slot's point, then the hold goes
    assert sched.cut() is None  # still held
    requests.release(hold)
    released = sched.cut()
    assert released is not None and xids(released) == [2]
    sched.complete(released)
    record = sched.cut()
    assert record is not None and record.requested == Lsn(3500)


def test_a_hold_whose_writer_died_lapses_and_is_removed(tmp_path: Path) -> None:
    requests = CutRequests(tmp_path / "work", interval=0.0)
    f, sched, _ = make(tmp_path, linger=0.0, requests=requests)
    txn(f, 1, 2000, 1, first=True)
    hold = requests.hold(Lsn(1000), -1.0)  # already past its time
    batch = cut_now(sched, frames=False)
    assert xids(batch) == [1]
    assert not hold.exists()
