"""Which cuts are kept (sink/cuts.py ``kept``): pure, on values."""

from __future__ import annotations

import datetime as dt

from sparkapply.lsn import Lsn
from sparkapply.sink.cuts import DENSE_CUTS, DENSE_SECONDS, THIN_SECONDS, Cut, kept

NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)


def cut(lsn: int, seconds_ago: float, *, requested: bool = False) -> Cut:
    at = NOW - dt.timedelta(seconds=seconds_ago)
    return Cut(Lsn(lsn), at, at, {"public.t": lsn}, {"public.t": "public.t"}, requested)


def test_recent_cuts_are_all_kept_older_ones_thinned_to_one_per_interval() -> None:
    # One cut every 10 s over the last 10 minutes, newest last.
    cuts = [cut(i, 600 - 10 * i) for i in range(61)]
    out = kept(cuts, NOW, retain_seconds=3600)
    recent = [c for c in cuts if (NOW - c.recorded_at).total_seconds() <= DENSE_SECONDS]
    assert all(c in out for c in recent)
    older = [c for c in out if c not in recent]
    buckets = {int(c.recorded_at.timestamp() // THIN_SECONDS) for c in older}
    assert len(older) == len(buckets)  # one per interval
    # ...the last of its interval
    for c in older:
        same = [
            d
            for d in cuts
            if int(d.recorded_at.timestamp() // THIN_SECONDS)
            == int(c.recorded_at.timestamp() // THIN_SECONDS)
        ]
        assert c is max(same, key=lambda d: d.lsn)
    assert [c.lsn for c in out] == sorted(c.lsn for c in out)


def test_requested_cuts_stay_until_retain_seconds_and_the_newest_always() -> None:
    asked = cut(5, 1000, requested=True)
    cuts = [cut(1, 5000), cut(2, 1005), asked, cut(6, 995), cut(7, 4000)]
    out = kept(sorted(cuts, key=lambda c: c.lsn), NOW, retain_seconds=3600)
    assert asked in out
    assert cut(1, 5000) not in out  # older than retain_seconds
    # The newest cut by LSN is kept even when older than retain_seconds.
    only_old = [cut(1, 9000), cut(2, 8000)]
    assert [c.lsn for c in kept(only_old, NOW, retain_seconds=3600)] == [2]
    assert kept([], NOW, retain_seconds=3600) == []


def test_at_most_dense_cuts_of_the_last_minute_are_kept_whole() -> None:
    """Ten cuts a second for the last 100 s: the newest DENSE_CUTS of them, then the
    last of each minute before those."""
    cuts = [cut(i, 100 - i / 10) for i in range(1000)]
    out = kept(cuts, NOW, retain_seconds=3600)
    newest = cuts[-DENSE_CUTS:]
    assert all(c in out for c in newest)
    older = [c for c in out if c not in newest]
    start = newest[0].recorded_at
    assert all(c.recorded_at < start for c in older)
    # One per minute before them: the last of each, never more than one.
    buckets = [int(c.recorded_at.timestamp() // THIN_SECONDS) for c in older]
    assert len(buckets) == len(set(buckets)) and 1 <= len(older) <= 2
    assert len(out) <= DENSE_CUTS + 2
