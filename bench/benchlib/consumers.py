"""PostgreSQL's own consumers of a backlog, and what every consumer's run reports.

A consumer drains a backlog behind one interface, ``run(backlog) -> Run``; it is set
up (``prepare()``: its slots or subscriptions) before the backlog is written, as a
consumer that was running before the load would have been, and uses one of them per
round. sparkapply's consumer is in :mod:`benchlib.sparkapply_runs`.

- :class:`PgRecvLogical`: ``pg_recvlogical`` to /dev/null: the server's
  decode-and-send rate, the bound for every consumer.
- :class:`NativeSubscription`: a native subscription (``streaming = parallel``)
  enabled until its slot confirms the backlog.
- :class:`NativeCopy`: a native subscription's initial copy (``copy_data = true``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import psycopg

from benchlib.metering import CpuMeter, loadavg
from benchlib.servers import PUBLICATION, confirmed_flush, create_slot, postmaster_pid
from benchlib.workloads import Backlog, checksum, prefill
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.lsn import Lsn

PLUGIN_OPTIONS = {  # what sparkapply negotiates with a PostgreSQL 16 publisher
    "proto_version": "4",
    "publication_names": PUBLICATION,
    "streaming": "parallel",
    "two_phase": "on",
    "messages": "true",
}
POLL = 0.02  # seconds between looks at a native subscriber's progress


@dataclass(slots=True)
class Run:
    seconds: float
    load_before: float  # 1-minute load average when the run started (other users)
    cpu: dict[str, float] = field(default_factory=dict)  # consumer / publisher CPU s
    phases: dict[str, float] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


class Consumer(Protocol):
    name: str

    def prepare(self) -> None:
        """Set every round up, before the backlog is written."""

    def run(self, backlog: Backlog) -> Run:
        """Drain ``backlog`` (the next round), verify the copy, and say what it cost."""


@dataclass(slots=True)
class Results:
    """One consumer's runs, best first in the summary."""

    name: str
    runs: list[Run] = field(default_factory=list)

    @property
    def best(self) -> Run:
        return min(self.runs, key=lambda r: r.seconds)

    @property
    def spread(self) -> float:
        secs = [r.seconds for r in self.runs]
        return (max(secs) - min(secs)) / min(secs)

    def summary(self, changes: int) -> dict[str, Any]:
        secs = [r.seconds for r in self.runs]
        return {
            "seconds_best": round(self.best.seconds, 3),
            "seconds_median": round(statistics.median(secs), 3),
            "seconds_runs": [round(s, 3) for s in secs],
            "spread": round(self.spread, 3),
            "rows_per_s_best": round(changes / self.best.seconds),
            "load_before": [round(r.load_before, 2) for r in self.runs],
            "cpu_seconds_runs": [r.cpu for r in self.runs],
            "best_run": {
                "phases": {k: round(v, 3) for k, v in self.best.phases.items()},
                **self.best.detail,
            },
        }


def recvlogical(pub: EmbeddedPostgres, slot: str, endpos: Lsn) -> float:
    """Seconds ``pg_recvlogical`` takes to receive ``slot``'s stream up to ``endpos``
    (it exits by itself there) with the options sparkapply negotiates, to /dev/null."""
    cmd = [str(pub.binary("pg_recvlogical")), "-d", pub.dsn(), "--slot", slot, "--start"]
    cmd += ["--endpos", str(endpos), "-f", "/dev/null", "--no-loop", "-F", "0"]
    for key, value in PLUGIN_OPTIONS.items():
        cmd += ["-o", f"{key}={value}"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"pg_recvlogical failed ({proc.returncode}): {proc.stderr.strip()}")
    confirmed = confirmed_flush(pub.dsn(), slot)
    if confirmed < endpos:  # it must have received the whole stream
        raise SystemExit(f"pg_recvlogical stopped at {confirmed}, before {endpos}")
    return elapsed


class PgRecvLogical:
    """pg_recvlogical is our child: its CPU is in our tree once it has been reaped."""

    name = "pg_recvlogical"

    def __init__(self, pub: EmbeddedPostgres, rounds: int) -> None:
        self.pub = pub
        self.slots = [f"recv_{i}" for i in range(rounds)]

    def prepare(self) -> None:
        for slot in self.slots:
            create_slot(self.pub.dsn(), slot)

    def run(self, backlog: Backlog) -> Run:
        slot = self.slots.pop(0)
        load = loadavg()
        with CpuMeter(os.getpid(), postmaster_pid(self.pub)) as cpu:
            elapsed = recvlogical(self.pub, slot, backlog.endpos)
        detail = {"confirmed_flush": str(confirmed_flush(self.pub.dsn(), slot))}
        return Run(elapsed, load, cpu.as_dict(), detail=detail)


def _poll(
    until: Callable[[], bool], check: Callable[[], None], started: float, timeout: float, what: str
) -> None:
    """Poll ``until`` every POLL seconds; every 50 polls ``check`` for errors."""
    polls = 0
    while not until():
        polls += 1
        if polls % 50 == 0:
            check()
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"{what} timed out")
        time.sleep(POLL)


class NativeSubscription:
    """The consumer's CPU is the subscriber cluster's (its apply workers). Its table is
    emptied (or refilled, for a prefilled workload) before each round, untimed."""

    name = "native (streaming=parallel)"

    def __init__(
        self,
        pub: EmbeddedPostgres,
        sub: EmbeddedPostgres,
        rounds: int,
        *,
        timeout: float,
        prefilled: int = 0,
    ) -> None:
        self.pub, self.sub = pub, sub
        self.names = [f"native_{i}" for i in range(rounds)]
        self.timeout = timeout
        self.prefilled = prefilled

    def prepare(self) -> None:
        with psycopg.connect(self.sub.dsn(), autocommit=True) as conn:
            for name in self.names:
                conn.execute(
                    f"CREATE SUBSCRIPTION {name} CONNECTION '{self.pub.dsn()}'"
                    f" PUBLICATION {PUBLICATION} WITH (copy_data = false,"
                    " streaming = parallel, create_slot = true, enabled = false)"
                )

    def run(self, backlog: Backlog) -> Run:
        name = self.names.pop(0)
        if self.prefilled:
            prefill(self.sub.dsn(), self.prefilled)
        with (
            psycopg.connect(self.sub.dsn(), autocommit=True) as sub,
            psycopg.connect(self.pub.dsn(), autocommit=True) as pub,
        ):
            if not self.prefilled:
                sub.execute(f"TRUNCATE {backlog.table}")
            sub.execute("CHECKPOINT")
            parallel = polls = 0

            def caught_up() -> bool:
                nonlocal parallel, polls
                row = pub.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots"
                    " WHERE slot_name = %s",
                    (str(backlog.target), name),
                ).fetchone()
                polls += 1
                if polls % 10 == 0:  # is a parallel apply worker at work?
                    seen = sub.execute(
                        "SELECT count(*) FROM pg_stat_subscription"
                        " WHERE subname = %s AND leader_pid IS NOT NULL",
                        (name,),
                    ).fetchone()
                    parallel = max(parallel, int(seen[0]) if seen else 0)
                return row is not None and bool(row[0])

            load = loadavg()
            with CpuMeter(postmaster_pid(self.sub), postmaster_pid(self.pub)) as cpu:
                t = time.perf_counter()
                sub.execute(f"ALTER SUBSCRIPTION {name} ENABLE")
                check = partial(_check_errors, sub, name, "apply")
                _poll(caught_up, check, t, self.timeout, f"native subscription {name}")
                elapsed = time.perf_counter() - t
            sub.execute(f"ALTER SUBSCRIPTION {name} DISABLE")
            _check_errors(sub, name, "apply")
            got = checksum(sub, backlog.table, backlog.amount)
        backlog.verify(f"native {name}", got)
        detail = {"verified": got.as_json(), "parallel_apply_workers_seen": parallel}
        return Run(elapsed, load, cpu.as_dict(), detail=detail)


class NativeCopy:
    """``CREATE SUBSCRIPTION ... WITH (copy_data = true)``, timed until the table is
    ready (copied by the table-sync worker, caught up, handed to the apply worker);
    dropped afterwards and the table emptied for the next round."""

    name = "PostgreSQL subscriber (copy_data)"

    def __init__(self, pub: EmbeddedPostgres, sub: EmbeddedPostgres, rounds: int) -> None:
        self.pub, self.sub = pub, sub
        self.names = [f"bench_native_{i}" for i in range(rounds)]

    def prepare(self) -> None:
        pass  # the subscription's slot is its copy's snapshot: made when timed

    def run(self, backlog: Backlog) -> Run:
        name = self.names.pop(0)
        with psycopg.connect(self.sub.dsn(), autocommit=True) as sub:
            sub.execute(f"TRUNCATE {backlog.table}")
            sub.execute("CHECKPOINT")

            def ready() -> bool:
                row = sub.execute(
                    "SELECT r.srsubstate FROM pg_subscription_rel r "
                    "JOIN pg_subscription s ON s.oid = r.srsubid "
                    "WHERE s.subname = %s AND r.srrelid = %s::regclass",
                    (name, backlog.table),
                ).fetchone()
                return row is not None and row[0] == "r"

            load = loadavg()
            with CpuMeter(postmaster_pid(self.sub), postmaster_pid(self.pub)) as cpu:
                t = time.perf_counter()
                sub.execute(
                    f"CREATE SUBSCRIPTION {name} CONNECTION '{self.pub.dsn()}'"
                    f" PUBLICATION {PUBLICATION}"
                    " WITH (copy_data = true, create_slot = true, streaming = parallel)"
                )
                check = partial(_check_errors, sub, name, "sync")
                _poll(ready, check, t, 3600.0, "the native table sync")
                elapsed = time.perf_counter() - t
            got = checksum(sub, backlog.table, backlog.amount)
            sub.execute(f"DROP SUBSCRIPTION {name}")  # drops its slot on the publisher too
        backlog.verify("native copy", got)
        return Run(elapsed, load, cpu.as_dict(), detail={"verified": got.as_json()})


def _check_errors(sub: psycopg.Connection[Any], name: str, kind: str) -> None:
    """``kind``: apply or sync, the error counter of pg_stat_subscription_stats."""
    row = sub.execute(
        f"SELECT {kind}_error_count FROM pg_stat_subscription_stats WHERE subname = %s", (name,)
    ).fetchone()
    if row is not None and row[0]:
        raise SystemExit(f"native subscription {name} failed ({kind}); see the subscriber's log")
