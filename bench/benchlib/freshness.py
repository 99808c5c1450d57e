"""Freshness: how long after a commit on the publisher the consumer has it durably.

Sampled on the publisher, in one query every ``interval`` (10 ms): the monotonic time
(the middle of the query's round trip), ``pg_current_wal_lsn()`` (WAL written: with
``synchronous_commit = on`` a transaction's commit record is written before its
COMMIT returns) and each consumer slot's ``confirmed_flush_lsn`` (what the consumer
has said is durable). Both sequences never go back.

The lag of a WAL position ``p`` is the time it became durable at the consumer (the
first sample whose confirmed_flush_lsn is at or past ``p``) minus the time it was
written (the first sample whose WAL position is at or past ``p``). Every sample taken
while the load runs gives one position, the WAL written at that instant, so the
distribution is over time (one value per 10 ms), the same for every consumer, and
its resolution is the sampling interval. The *tail* is the time from the load's end
until the consumer has everything written by then.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg


@dataclass(slots=True)
class Samples:
    """Sample times (monotonic s), WAL written, and each slot's confirmed flush."""

    times: list[float] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    durable: dict[str, list[int]] = field(default_factory=dict)


def lags(
    times: Sequence[float],
    written: Sequence[int],
    durable: Sequence[int],
    start: float,
    end: float,
) -> list[float | None]:
    """For each sample ``i`` taken in [start, end]: the seconds until ``durable`` first
    reached ``written[i]`` (at sample ``i`` or later), or None if it never did."""
    out: list[float | None] = []
    for i, t in enumerate(times):
        if not start <= t <= end:
            continue
        # durable never goes back: the first sample at or past the position, not before i.
        j = max(i, bisect.bisect_left(durable, written[i]))
        out.append(times[j] - t if j < len(times) else None)
    return out


def tail(times: Sequence[float], durable: Sequence[int], end: float, position: int) -> float | None:
    """Seconds from ``end`` until ``durable`` first reached ``position`` (0 if it was
    there by the first sample at or after ``end``), or None if it never did."""
    first = bisect.bisect_left(times, end)
    j = max(first, bisect.bisect_left(durable, position))
    if j >= len(times):
        return None
    return max(0.0, times[j] - end)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between the closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def summary(values: Sequence[float | None]) -> dict[str, Any]:
    """p50, p95, max of the lags (seconds), and how many positions never arrived."""
    known = [v for v in values if v is not None]
    return {
        "samples": len(values),
        "unresolved": len(values) - len(known),
        "p50": round(percentile(known, 50), 3) if known else None,
        "p95": round(percentile(known, 95), 3) if known else None,
        "max": round(max(known), 3) if known else None,
    }


def per_second_max(
    times: Sequence[float], values: Sequence[float | None], start: float
) -> list[float | None]:
    """The largest lag of each second from ``start`` (None for a second with a
    position that never arrived); ``times`` are the values' sample times."""
    out: list[float | None] = []
    for t, v in zip(times, values, strict=True):
        second = int(t - start)
        while len(out) <= second:
            out.append(0.0)
        if v is None or out[second] is None:
            out[second] = None
        else:
            out[second] = max(out[second] or 0.0, round(v, 3))
    return out


class LsnSampler:
    """Samples the publisher every ``interval`` seconds on a thread of its own, until
    stopped (a context manager)."""

    QUERY = (
        "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint,"
        " coalesce(json_object_agg(slot_name, (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint),"
        " '{}'::json) FROM pg_replication_slots WHERE slot_name = ANY(%s)"
    )

    def __init__(self, dsn: str, slots: Sequence[str], interval: float = 0.01) -> None:
        self.dsn = dsn
        self.slots = list(slots)
        self.interval = interval
        self.samples = Samples(durable={s: [] for s in self.slots})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def __enter__(self) -> LsnSampler:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="bench-lsn-sampler", daemon=True
        )
        self._thread.start()
        ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.error is not None and exc[0] is None:
            raise SystemExit(f"the LSN sampler failed: {self.error}")

    def _run(self, ready: threading.Event) -> None:
        s = self.samples
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                ready.set()
                while not self._stop.is_set():
                    t0 = time.monotonic()
                    row = conn.execute(self.QUERY, (self.slots,)).fetchone()
                    t1 = time.monotonic()
                    assert row is not None
                    confirmed = row[1]
                    s.times.append((t0 + t1) / 2)
                    s.written.append(int(row[0]))
                    for slot in self.slots:
                        # A slot not there (or not yet confirmed) counts as 0; the
                        # sequence must never go back.
                        value = int(confirmed.get(slot) or 0)
                        seq = s.durable[slot]
                        seq.append(max(value, seq[-1]) if seq else value)
                    self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))
        except BaseException as exc:  # reported by __exit__
            self.error = exc
            ready.set()

    def current_written(self) -> int:
        s = self.samples
        return s.written[-1] if s.written else 0
