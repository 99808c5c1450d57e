"""Apply throughput: sparkapply beside PostgreSQL's own subscriber and pg_recvlogical.

    python bench/apply_bench.py [--workload bulk|mixed] [--rows 1000000] [--repeat 3]
                                [--profile] [--profile-dir DIR]

Starts two bundled PostgreSQL 16 servers in a temporary directory, a publisher and a
native subscriber (``wal_level=logical``, ``logical_decoding_work_mem=64MB``), creates
``orders (id bigint primary key, customer int, amount numeric(12,2), status text,
created_at timestamptz, note text)`` on both, one publication, and, before any row is
written, every consumer, one per round: a slot for ``pg_recvlogical``; a disabled
native subscription (``copy_data = false, streaming = parallel, create_slot = true,
enabled = false``); and for sparkapply a first ``run(until_caught_up=True)`` on the
empty table, which creates its slot, work dir and Iceberg table (and records the
empty initial copy) as a user who started it before the load would have. Then the
backlog is written once, with every consumer stopped:

``bulk``   ``--rows`` rows inserted in ONE transaction (streamed by the server, since
           it passes logical_decoding_work_mem);
``mixed``  the same rows in transactions of 1,000 inserts; after every 10,000 rows one
           transaction updates 10% of them and one deletes 5% of them;
``update`` ONE transaction updating every row of a table prefilled with ``--rows`` rows;
``scatter`` ``--updates`` (20,000) single-row update transactions on random rows of a
           table prefilled with ``--rows`` rows.

For ``update`` and ``scatter`` the table is filled before any consumer exists: the
native subscriber's copy is filled with the same rows (and refilled before each round,
untimed), and each sparkapply run's table is its own initial copy, made when it was
primed.

and ends with a non-transactional logical message whose LSN is ``pg_recvlogical``'s
``--endpos``. The consumers then drain the SAME backlog one after another (never two
at a time: the machine has 2 cores), round-robin over ``--repeat`` rounds:

(a) ``pg_recvlogical`` on its slot, with the options sparkapply negotiates, to
    /dev/null up to ``--endpos``: the server's decode-and-send rate, the bound.
(b) the native subscription, from ``ALTER SUBSCRIPTION ... ENABLE`` until its slot's
    ``confirmed_flush_lsn`` on the publisher reaches the target (the WAL insert
    position after the backlog); then disabled, and the subscriber's table emptied
    for the next round.
(c) sparkapply: ``Subscriber(config, spark=session).run(until_caught_up=True)`` on
    that round's work dir and SQLite catalog, ``local[2]``. The Spark session (and one warm-up job
    that starts the Python workers) is created once, before, and reported apart.

Every run is verified: count, sum(id) and sum(amount) of the consumer's copy equal
the publisher's, and sparkapply applied every change from the stream. Prints seconds,
row changes per second and CPU seconds (consumer, publisher) for each consumer (best
of ``--repeat``, with every run so the noise is visible), the rate ratios
sparkapply/native and sparkapply/pg_recvlogical, and sparkapply's phases (setup,
receive and spool, Spark job, Iceberg commit, tail), measured by wrapping driver-side
functions in this process. The figures go to ``bench/results/apply_<workload>_<rows>.json``.

``--profile`` adds two sparkapply runs after the timed ones: one with timers around
the executor's phases (fold, Arrow conversion, Parquet write), one under cProfile
(receiving thread on the driver, and the Spark task on the executor). See
bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import marshal
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from sparkapply.embedded import EmbeddedPostgres
from sparkapply.lsn import INVALID_LSN, Lsn

SETTINGS = {
    "logical_decoding_work_mem": "64MB",
    "debug_logical_replication_streaming": "buffered",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "wal_sender_timeout": "0",
    "wal_receiver_timeout": "0",
    # A vacuum of a 1M-row table started by one measurement must not run during the
    # next one; the publisher's table is vacuumed once, by hand, before measuring.
    "autovacuum": "off",
}
SUBSCRIBER_SETTINGS = {
    **SETTINGS,
    "max_logical_replication_workers": "8",
    "max_parallel_apply_workers_per_subscription": "2",
    "max_worker_processes": "16",
}
PUBLICATION = "bench_pub"
TABLE = "orders"
DDL = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer int, amount numeric(12, 2),"
    " status text, created_at timestamptz, note text)"
)
INSERT = (
    "INSERT INTO orders SELECT g, (g * 7919) %% 100000, ((g * 37) %% 1000000) / 100.0,"
    " (ARRAY['new', 'paid', 'shipped', 'cancelled'])[1 + g %% 4],"
    " timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', md5(g::text)"
    " FROM generate_series(%s::bigint, %s::bigint) g"
)
UPDATE = (
    "UPDATE orders SET amount = amount + 1, status = 'refunded', note = note || ' (refund)'"
    " WHERE id BETWEEN %s AND %s AND id %% 10 = 0"
)
DELETE = "DELETE FROM orders WHERE id BETWEEN %s AND %s AND id %% 20 = 5"
TXN_ROWS = 1_000  # mixed: inserts per transaction
BLOCK_ROWS = 10_000  # mixed: one update and one delete transaction per block
PLUGIN_OPTIONS = {  # what sparkapply negotiates with a PostgreSQL 16 publisher
    "proto_version": "4",
    "publication_names": PUBLICATION,
    "streaming": "parallel",
    "two_phase": "on",
    "messages": "true",
}
SPARK_MASTER = "local[2]"
SPARK_CONF = {"spark.driver.memory": "2g"}


def log(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def loadavg() -> float:
    return os.getloadavg()[0]


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by ``root`` and every process below it.

    utime + stime of the live processes, plus cutime + cstime: what their children
    that have exited and been waited for used (a walsender reaped by the postmaster,
    pg_recvlogical reaped by us). Differences of two readings are what a run cost.
    """
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / _TICK


def postmaster_pid(server: EmbeddedPostgres) -> int:
    return int((server.data_dir / "postmaster.pid").read_text().split()[0])


class CpuMeter:
    """CPU seconds of the consumer's processes and of the publisher over one run."""

    def __init__(self, consumer_root: int, publisher_root: int) -> None:
        self.roots = (consumer_root, publisher_root)
        self.start = (0.0, 0.0)

    def __enter__(self) -> CpuMeter:
        self.start = (tree_cpu(self.roots[0]), tree_cpu(self.roots[1]))
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer = tree_cpu(self.roots[0]) - self.start[0]
        self.publisher = tree_cpu(self.roots[1]) - self.start[1]

    def as_dict(self) -> dict[str, float]:
        return {"consumer": round(self.consumer, 2), "publisher": round(self.publisher, 2)}


# -- the backlog ----------------------------------------------------------------------


@dataclass(slots=True)
class Checksum:
    count: int
    sum_id: int
    sum_amount: Decimal

    def as_json(self) -> dict[str, Any]:
        return {"count": self.count, "sum_id": self.sum_id, "sum_amount": str(self.sum_amount)}


@dataclass(slots=True)
class Backlog:
    workload: str
    rows: int  # rows inserted
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    transactions: int = 0
    seconds: float = 0.0
    start_lsn: Lsn = INVALID_LSN
    endpos: Lsn = INVALID_LSN  # the end marker: pg_recvlogical's --endpos
    target: Lsn = INVALID_LSN  # WAL insert position after the backlog
    expected: Checksum | None = None

    @property
    def changes(self) -> int:
        return self.inserts + self.updates + self.deletes

    @property
    def wal_bytes(self) -> int:
        return int(self.target) - int(self.start_lsn)


def checksum(conn: psycopg.Connection[Any]) -> Checksum:
    row = conn.execute(
        "SELECT count(*), coalesce(sum(id), 0), coalesce(sum(amount), 0) FROM orders"
    ).fetchone()
    assert row is not None
    return Checksum(int(row[0]), int(row[1]), Decimal(row[2]))


def insert_lsn(conn: psycopg.Connection[Any]) -> Lsn:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(str(row[0]))


PREFILLED = ("update", "scatter")
SCATTER_SEED = 20_251_123


def prefill(dsn: str, rows: int) -> None:
    """The same deterministic rows on the publisher and on the native subscriber."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE orders")
        conn.execute(INSERT, (1, rows))
        conn.execute("VACUUM ANALYZE orders")
        conn.execute("CHECKPOINT")


def write_backlog(dsn: str, workload: str, rows: int, updates: int = 20_000) -> Backlog:
    b = Backlog(workload, 0 if workload in PREFILLED else rows)
    with psycopg.connect(dsn, autocommit=True) as conn:
        b.start_lsn = insert_lsn(conn)
        t = time.perf_counter()
        if workload == "bulk":
            b.inserts = conn.execute(INSERT, (1, rows)).rowcount
            b.transactions = 1
        elif workload == "update":
            b.updates = conn.execute(
                "UPDATE orders SET amount = amount + 1, status = 'updated'"
            ).rowcount
            b.transactions = 1
        elif workload == "scatter":
            import random

            rnd = random.Random(SCATTER_SEED)
            for _ in range(updates):
                b.updates += conn.execute(
                    "UPDATE orders SET amount = amount + 1, status = 'scattered' WHERE id = %s",
                    (rnd.randint(1, rows),),
                ).rowcount
                b.transactions += 1
        else:
            block_start = 1
            for lo in range(1, rows + 1, TXN_ROWS):
                hi = min(lo + TXN_ROWS - 1, rows)
                b.inserts += conn.execute(INSERT, (lo, hi)).rowcount
                b.transactions += 1
                if hi - block_start + 1 >= BLOCK_ROWS or hi == rows:
                    b.updates += conn.execute(UPDATE, (block_start, hi)).rowcount
                    b.deletes += conn.execute(DELETE, (block_start, hi)).rowcount
                    b.transactions += 2
                    block_start = hi + 1
        b.seconds = time.perf_counter() - t
        # pgoutput sends a non-transactional message at once, in an XLogData whose
        # position is the end of its record: the value this function returns.
        row = conn.execute(
            "SELECT pg_logical_emit_message(false, 'apply_bench', 'end')::text"
        ).fetchone()
        assert row is not None
        b.endpos = Lsn.parse(str(row[0]))
        b.target = insert_lsn(conn)
        b.expected = checksum(conn)
        conn.execute("VACUUM ANALYZE orders")  # not autovacuum during a measurement
        conn.execute("CHECKPOINT")
    return b


# -- results --------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    seconds: float
    load_before: float  # 1-minute load average when the run started (other users)
    cpu: dict[str, float] = field(default_factory=dict)  # consumer / publisher CPU s
    phases: dict[str, float] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Consumer:
    name: str
    runs: list[Run] = field(default_factory=list)

    @property
    def best(self) -> Run:
        return min(self.runs, key=lambda r: r.seconds)

    def summary(self, changes: int) -> dict[str, Any]:
        secs = [r.seconds for r in self.runs]
        return {
            "seconds_best": round(self.best.seconds, 3),
            "seconds_median": round(statistics.median(secs), 3),
            "seconds_runs": [round(s, 3) for s in secs],
            "spread": round((max(secs) - min(secs)) / min(secs), 3),
            "rows_per_s_best": round(changes / self.best.seconds),
            "load_before": [round(r.load_before, 2) for r in self.runs],
            "cpu_seconds_runs": [r.cpu for r in self.runs],
            "best_run": {
                "phases": {k: round(v, 3) for k, v in self.best.phases.items()},
                **self.best.detail,
            },
        }


# -- (a) pg_recvlogical ---------------------------------------------------------------


def create_slot(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", (slot,)
        )


def confirmed_flush(dsn: str, slot: str) -> Lsn:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None and row[0] is not None
    return Lsn.parse(str(row[0]))


def run_recvlogical(pub: EmbeddedPostgres, slot: str, backlog: Backlog) -> Run:
    """pg_recvlogical is our child: its CPU is in our tree once it has been reaped."""
    dsn = pub.dsn()
    cmd = [str(pub.binary("pg_recvlogical")), "-d", dsn, "--slot", slot, "--start"]
    cmd += ["--endpos", str(backlog.endpos), "-f", "/dev/null", "--no-loop", "-F", "0"]
    for key, value in PLUGIN_OPTIONS.items():
        cmd += ["-o", f"{key}={value}"]
    load = loadavg()
    with CpuMeter(os.getpid(), postmaster_pid(pub)) as cpu:
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"pg_recvlogical failed ({proc.returncode}): {proc.stderr.strip()}")
    confirmed = confirmed_flush(dsn, slot)
    if confirmed < backlog.endpos:  # it must have received the whole stream
        raise SystemExit(f"pg_recvlogical stopped at {confirmed}, before {backlog.endpos}")
    return Run(elapsed, load, cpu.as_dict(), detail={"confirmed_flush": str(confirmed)})


# -- (b) the native subscriber --------------------------------------------------------


def create_subscription(sub_dsn: str, pub_dsn: str, name: str) -> None:
    with psycopg.connect(sub_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE SUBSCRIPTION {name} CONNECTION '{pub_dsn}' PUBLICATION {PUBLICATION}"
            " WITH (copy_data = false, streaming = parallel, create_slot = true,"
            " enabled = false)"
        )


def run_native(
    pub: EmbeddedPostgres,
    subscriber: EmbeddedPostgres,
    name: str,
    backlog: Backlog,
    timeout: float,
    prefilled: int = 0,
) -> Run:
    """The consumer's CPU is the subscriber cluster's (its apply workers)."""
    if prefilled:
        prefill(subscriber.dsn(), prefilled)
    with (
        psycopg.connect(subscriber.dsn(), autocommit=True) as sub,
        psycopg.connect(pub.dsn(), autocommit=True) as pconn,
    ):
        if not prefilled:
            sub.execute("TRUNCATE orders")
        sub.execute("CHECKPOINT")
        load = loadavg()
        with CpuMeter(postmaster_pid(subscriber), postmaster_pid(pub)) as cpu:
            t = time.perf_counter()
            sub.execute(f"ALTER SUBSCRIPTION {name} ENABLE")
            polls = parallel = 0
            while True:
                row = pconn.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots"
                    " WHERE slot_name = %s",
                    (str(backlog.target), name),
                ).fetchone()
                if row is not None and row[0]:
                    break
                polls += 1
                if polls % 10 == 0:  # is a parallel apply worker at work?
                    seen = sub.execute(
                        "SELECT count(*) FROM pg_stat_subscription"
                        " WHERE subname = %s AND leader_pid IS NOT NULL",
                        (name,),
                    ).fetchone()
                    parallel = max(parallel, int(seen[0]) if seen else 0)
                if polls % 50 == 0:
                    _check_native_errors(sub, name)
                    if time.perf_counter() - t > timeout:
                        raise SystemExit(f"native subscription {name} timed out")
                time.sleep(0.02)
            elapsed = time.perf_counter() - t
        sub.execute(f"ALTER SUBSCRIPTION {name} DISABLE")
        _check_native_errors(sub, name)
        got = checksum(sub)
    verify(f"native {name}", got, backlog)
    detail = {"verified": got.as_json(), "parallel_apply_workers_seen": parallel}
    return Run(elapsed, load, cpu.as_dict(), detail=detail)


def _check_native_errors(sub: psycopg.Connection[Any], name: str) -> None:
    row = sub.execute(
        "SELECT apply_error_count FROM pg_stat_subscription_stats WHERE subname = %s", (name,)
    ).fetchone()
    if row is not None and row[0]:
        raise SystemExit(f"native subscription {name} failed to apply; see the subscriber's log")


# -- (c) sparkapply -------------------------------------------------------------------


class Probe:
    """Wall-clock marks around driver-side sparkapply functions, in this process.

    Wraps (and restores) ``ReplicationStream.start``, ``Applier.apply`` and the
    ``run_tasks`` / ``commit_files`` that the applier module calls: each is called
    once per session or batch, so the wrappers cost nothing measurable.
    """

    def __init__(self, run_tasks: Callable[..., Any] | None = None) -> None:
        self.stream_start: float | None = None
        # CPU clock of the receiving thread, read at START_REPLICATION and when the
        # first batch starts: is the receive phase CPU-bound in our loop or waiting?
        self._clock: int | None = None
        self.receive_cpu: tuple[float, float] | None = None
        self.batches: list[dict[str, Any]] = []
        self.jobs: list[tuple[float, float]] = []
        self.commits: list[tuple[float, float]] = []
        self._run_tasks = run_tasks

    @contextlib.contextmanager
    def installed(self) -> Iterator[Probe]:
        import sparkapply.apply.batch as applier_mod
        import sparkapply.subscriber as subscriber_mod

        stream_cls = subscriber_mod.ReplicationStream  # type: ignore[attr-defined]
        applier_cls = applier_mod.Applier
        orig_start = stream_cls.start
        orig_apply = applier_cls.apply
        orig_run_tasks = getattr(applier_mod, "run_tasks")  # noqa: B009
        orig_commit = getattr(applier_mod, "commit_files")  # noqa: B009
        probe = self
        job_fn = self._run_tasks or orig_run_tasks

        def start(stream: Any, *a: Any, **k: Any) -> Any:
            probe.stream_start = time.perf_counter()
            probe._clock = time.pthread_getcpuclockid(threading.get_ident())
            probe.receive_cpu = (time.clock_gettime(probe._clock), 0.0)
            return orig_start(stream, *a, **k)

        def apply(applier: Any, batch: Any) -> Any:
            t0 = time.perf_counter()
            if not probe.batches and probe.receive_cpu and probe._clock is not None:
                probe.receive_cpu = (probe.receive_cpu[0], time.clock_gettime(probe._clock))
            stats = orig_apply(applier, batch)
            probe.batches.append(
                {
                    "start": t0,
                    "end": time.perf_counter(),
                    "transactions": stats.transactions,
                    "changes": stats.changes,
                    "rows_written": stats.rows_written,
                    "rows_removed": stats.rows_removed,
                    "files_added": sum(len(r.added) for r in stats.results),
                    "files_removed": 0,  # merge-on-read: nothing is rewritten
                    "delete_files_added": sum(len(r.deletes) for r in stats.results),
                }
            )
            return stats

        def run_tasks(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return job_fn(*a, **k)
            finally:
                probe.jobs.append((t0, time.perf_counter()))

        def commit_files(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig_commit(*a, **k)
            finally:
                probe.commits.append((t0, time.perf_counter()))

        patches: list[tuple[Any, str, Any, Any]] = [
            (stream_cls, "start", start, orig_start),
            (applier_cls, "apply", apply, orig_apply),
            (applier_mod, "run_tasks", run_tasks, orig_run_tasks),
            (applier_mod, "commit_files", commit_files, orig_commit),
        ]
        for owner, attr, new, _ in patches:
            setattr(owner, attr, new)
        try:
            yield self
        finally:
            for owner, attr, _, old in patches:
                setattr(owner, attr, old)

    def phases(self, t0: float, t1: float) -> dict[str, float]:
        """Where the run's wall time went, from the driver's point of view.

        setup: run() until START_REPLICATION (preflight, catalog, slot check).
        receive: START_REPLICATION until the first batch starts (with one big
            transaction: the whole stream decoded, peeked and spooled).
        spark_job / iceberg_commit / other_apply: summed over batches; other_apply is
            the applier's own planning (table load, file listing, dependency graph).
        receive_overlapped: time after the first batch when no batch was running.
        tail: the last batch's end until run() returned (acknowledge, catch-up check).
        """
        if not self.batches or self.stream_start is None:
            return {"total": t1 - t0}
        first, last = self.batches[0]["start"], self.batches[-1]["end"]
        job = sum(b - a for a, b in self.jobs)
        commit = sum(b - a for a, b in self.commits)
        applying = sum(b["end"] - b["start"] for b in self.batches)
        return {
            "total": t1 - t0,
            "setup": self.stream_start - t0,
            "receive": first - self.stream_start,
            "spark_job": job,
            "iceberg_commit": commit,
            "other_apply": applying - job - commit,
            "receive_overlapped": (last - first) - applying,
            "tail": t1 - last,
        }

    def receive_thread_cpu(self) -> float | None:
        """CPU seconds of the receiving thread during the receive phase."""
        if self.receive_cpu is None or not self.receive_cpu[1]:
            return None
        return self.receive_cpu[1] - self.receive_cpu[0]


def sparkapply_config(dsn: str, work_dir: Path, slot: str) -> Any:
    from sparkapply.config import load_config

    return load_config(
        None,
        env={},
        overrides={
            "work_dir": str(work_dir),
            "source": {"dsn": dsn, "publication": PUBLICATION, "slot": slot},
            "sink": {
                "catalog": {
                    "type": "sql",
                    "uri": f"sqlite:///{work_dir}/catalog.db",
                    "warehouse": f"file://{work_dir}/warehouse",
                }
            },
            "spark": {"master": SPARK_MASTER},
            # Table maintenance (compaction folding a 1M-row delete file back) is not
            # apply work: off here, as autovacuum is off for the native subscriber.
            "maintenance": {"enabled": False},
        },
    )


def prime_sparkapply(spark: Any, pub: EmbeddedPostgres, root: Path, slot: str) -> None:
    """Set sparkapply up before the load, as a user would have: a first run on the
    still empty table creates its slot and its Iceberg table (and, where sparkapply
    copies tables it has never copied, records the empty copy). The timed run then
    streams the backlog instead of copying the table."""
    from sparkapply.subscriber import Subscriber

    config = sparkapply_config(pub.dsn(), root / f"work-{slot}", slot)
    Subscriber(config, spark=spark).run(until_caught_up=True)


def iceberg_checksum(catalog: Any) -> Checksum:
    import pyarrow.compute as pc

    table = catalog.load_table(("public", TABLE))
    arrow = table.scan(selected_fields=("id", "amount")).to_arrow()
    sum_id = pc.sum(arrow.column("id")).as_py() or 0
    sum_amount = pc.sum(arrow.column("amount")).as_py() or Decimal(0)
    return Checksum(arrow.num_rows, int(sum_id), Decimal(sum_amount))


def verify(who: str, got: Checksum, backlog: Backlog) -> None:
    exp = backlog.expected
    assert exp is not None
    if (got.count, got.sum_id, got.sum_amount) != (exp.count, exp.sum_id, exp.sum_amount):
        raise SystemExit(f"{who}: copy differs from the publisher: {got} != {exp}")


def run_sparkapply(
    spark: Any,
    pub: EmbeddedPostgres,
    root: Path,
    slot: str,
    backlog: Backlog,
    *,
    run_tasks: Callable[..., Any] | None = None,
    profile_driver: cProfile.Profile | None = None,
) -> Run:
    from sparkapply.subscriber import Subscriber

    """The consumer's CPU is this process's tree: driver, JVM, Python workers."""
    work = root / f"work-{slot}"
    config = sparkapply_config(pub.dsn(), work, slot)
    probe = Probe(run_tasks)
    sub = Subscriber(config, spark=spark)
    with probe.installed(), CpuMeter(os.getpid(), postmaster_pid(pub)) as cpu:
        load = loadavg()
        t0 = time.perf_counter()
        if profile_driver is not None:
            profile_driver.enable()
        try:
            summary = sub.run(until_caught_up=True)
        finally:
            if profile_driver is not None:
                profile_driver.disable()
        t1 = time.perf_counter()
    got = iceberg_checksum(sub.catalog)
    verify(f"sparkapply {slot}", got, backlog)
    if summary.changes != backlog.changes:  # the rows must have come through the stream
        raise SystemExit(
            f"sparkapply {slot} applied {summary.changes:,} changes from the stream,"
            f" expected {backlog.changes:,}"
        )
    spool = sum(f.stat().st_size for f in (work / "spool").glob("*") if f.is_file())
    detail = {
        "batches": summary.batches,
        "transactions": summary.transactions,
        "changes": summary.changes,
        "rows_written": sum(b["rows_written"] for b in probe.batches),
        "rows_removed": sum(b["rows_removed"] for b in probe.batches),
        "files_added": sum(b["files_added"] for b in probe.batches),
        "files_removed": sum(b["files_removed"] for b in probe.batches),
        "spool_bytes_left": spool,
        "receive_thread_cpu_seconds": _round(probe.receive_thread_cpu()),
        "verified": got.as_json(),
    }
    shutil.rmtree(work, ignore_errors=True)
    return Run(t1 - t0, load, cpu.as_dict(), phases=probe.phases(t0, t1), detail=detail)


# -- Spark session --------------------------------------------------------------------


def _warm(i: int) -> int:
    import sparkapply.apply.tasks  # noqa: F401  (the first task's imports, done now)

    return os.getpid()


def start_spark() -> tuple[Any, float, float]:
    from sparkapply.apply.session import get_session

    t = time.perf_counter()
    spark = get_session(SPARK_MASTER, "sparkapply-apply-bench", SPARK_CONF)
    startup = time.perf_counter() - t
    t = time.perf_counter()
    spark.sparkContext.parallelize(range(2), 2).map(_warm).collect()
    warmup = time.perf_counter() - t
    return spark, startup, warmup


# -- profiling (--profile) ------------------------------------------------------------

# Executor-side phases, timed inside the task: (module, attribute, phase name).
_TIMED = (
    ("sparkapply.apply.tasks", "fold_table", "fold (spool read + decode + net effect)"),
    ("sparkapply.apply.tasks", "apply_delta", "merge (Arrow + Parquet)"),
    ("sparkapply.apply.merge", "rows_to_arrow", "rows_to_arrow"),
    ("sparkapply.apply.merge", "to_arrow", "to_arrow (vectorised convert)"),
    ("sparkapply.apply.merge.TableWriter", "write", "parquet write"),
    ("sparkapply.apply.merge.TableWriter", "read", "parquet read"),
)


def _executor_task(task: Any, mode: str) -> tuple[Any, dict[str, float], bytes]:
    """run_table_task with phase timers (``mode='timers'``) or under cProfile.

    Defined in __main__, so Spark ships it to the Python worker by value.
    """
    import importlib
    import time as _time

    from sparkapply.apply import tasks as tasks_mod

    timers: dict[str, float] = {}
    restore = []
    if mode == "timers":
        for mod_name, attr, phase in _TIMED:
            if mod_name.endswith(".TableWriter"):
                owner: Any = importlib.import_module(mod_name.rsplit(".", 1)[0]).TableWriter
            else:
                owner = importlib.import_module(mod_name)
            orig = getattr(owner, attr)

            def timed(*a: Any, _orig: Any = orig, _phase: str = phase, **k: Any) -> Any:
                t = _time.perf_counter()
                try:
                    return _orig(*a, **k)
                finally:
                    timers[_phase] = timers.get(_phase, 0.0) + _time.perf_counter() - t

            setattr(owner, attr, timed)
            restore.append((owner, attr, orig))
    # cProfile's default (wall) clock: a thread_time clock would be robust to other
    # users of the machine but costs a Python call per event, ~10x slower overall,
    # and charges that cost to the many small calls. Profile on a quiet machine.
    prof = cProfile.Profile() if mode == "cprofile" else None
    t = _time.perf_counter()
    cpu = _time.thread_time()
    try:
        if prof is not None:
            prof.enable()
        result = tasks_mod.run_table_task(task)
        if prof is not None:
            prof.disable()
    finally:
        for owner, attr, orig in restore:
            setattr(owner, attr, orig)
    timers["task"] = _time.perf_counter() - t
    timers["task CPU"] = _time.thread_time() - cpu
    stats = b""
    if prof is not None:
        prof.create_stats()
        stats = marshal.dumps(prof.stats)
    return result, timers, stats


class ExecutorProfile:
    """A ``run_tasks`` replacement that runs the tasks through :func:`_executor_task`."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.timers: dict[str, float] = {}
        self.stats: list[bytes] = []

    def __call__(self, spark: Any, tasks: Sequence[Any]) -> list[Any]:
        if not tasks:
            return []
        mode = self.mode
        ordered = sorted(tasks, key=lambda t: -sum(s.nbytes for x in t.txns for s in x.segments))
        rdd = spark.sparkContext.parallelize(ordered, len(ordered))
        out = rdd.map(lambda task: _executor_task(task, mode)).collect()
        for _, timers, stats in out:
            for k, v in timers.items():
                self.timers[k] = self.timers.get(k, 0.0) + v
            if stats:
                self.stats.append(stats)
        return [r for r, _, _ in out]


def top_functions(stats: pstats.Stats, n: int = 18) -> list[dict[str, Any]]:
    rows = []
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({func})",
                "calls": ncalls,
                "tottime": round(tottime, 3),
                "cumtime": round(cumtime, 3),
            }
        )
    rows.sort(key=lambda r: -r["tottime"])
    return rows[:n]


def stats_text(stats: pstats.Stats, sort: str, n: int) -> str:
    buf = io.StringIO()
    stats.stream = buf  # type: ignore[attr-defined]
    stats.sort_stats(sort).print_stats(n)
    return buf.getvalue()


def profile_runs(
    spark: Any,
    pub: EmbeddedPostgres,
    root: Path,
    slots: Sequence[str],
    backlog: Backlog,
    out_dir: Path | None,
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    # 1. Timers only: executor phase wall times, close to an unprofiled run.
    ex = ExecutorProfile("timers")
    run = run_sparkapply(spark, pub, root, slots[0], backlog, run_tasks=ex)
    log(f"profile (timers): {run.seconds:.2f}s")
    result["timers_run"] = {
        "seconds": round(run.seconds, 3),
        "driver_phases": {k: round(v, 3) for k, v in run.phases.items()},
        "executor_phases": {k: round(v, 3) for k, v in ex.timers.items()},
    }
    # 2. cProfile: receiving thread on the driver, the task on the executor.
    ex = ExecutorProfile("cprofile")
    driver_prof = cProfile.Profile()  # the receiving thread only (where run() is called)
    run = run_sparkapply(
        spark, pub, root, slots[1], backlog, run_tasks=ex, profile_driver=driver_prof
    )
    log(f"profile (cProfile): {run.seconds:.2f}s")
    driver_stats = pstats.Stats(driver_prof)
    tmp = root / "executor.pstats"
    exec_stats: pstats.Stats | None = None
    for raw in ex.stats:
        tmp.write_bytes(raw)
        if exec_stats is None:
            exec_stats = pstats.Stats(str(tmp))
        else:
            exec_stats.add(str(tmp))
    result["cprofile_run"] = {
        "seconds": round(run.seconds, 3),
        "driver_phases": {k: round(v, 3) for k, v in run.phases.items()},
        "driver_receive_thread_top": top_functions(driver_stats),
        "executor_task_top": top_functions(exec_stats) if exec_stats else [],
    }
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        driver_stats.dump_stats(str(out_dir / "driver.pstats"))
        (out_dir / "driver.txt").write_text(stats_text(driver_stats, "cumulative", 40))
        if exec_stats is not None:
            exec_stats.dump_stats(str(out_dir / "executor.pstats"))
            (out_dir / "executor.txt").write_text(
                stats_text(exec_stats, "tottime", 40) + stats_text(exec_stats, "cumulative", 40)
            )
        log(f"profiles written to {out_dir}")
    return result


# -- main -----------------------------------------------------------------------------


def print_report(
    backlog: Backlog,
    consumers: Sequence[Consumer],
    spark_startup: float,
    spark_warmup: float,
    repeat: int,
) -> dict[str, float]:
    changes = backlog.changes
    if backlog.workload == "bulk":
        shape = f"{backlog.rows:,} rows inserted in one transaction"
    elif backlog.workload in PREFILLED:
        shape = (
            f"{backlog.updates:,} updates in {backlog.transactions:,} transaction(s)"
            " on a prefilled table"
        )
    else:
        shape = (
            f"{backlog.inserts:,} inserts in transactions of {TXN_ROWS:,}, {backlog.updates:,}"
            f" updates, {backlog.deletes:,} deletes ({backlog.transactions:,} transactions)"
        )
    print(f"workload {backlog.workload}: {shape}")
    print(
        f"{changes:,} row changes, {backlog.wal_bytes / 1e6:.1f} MB of WAL; "
        f"best of {repeat}, one consumer at a time"
    )
    print(
        f"{'consumer':<28}{'seconds':>8}{'rows/s':>10}{'CPU s':>7}{'pub CPU':>8}"
        f"   {'all runs (s)':<21}{'spread':>6}"
    )
    for c in consumers:
        secs = [r.seconds for r in c.runs]
        spread = (max(secs) - min(secs)) / min(secs)
        runs = " ".join(f"{s:.2f}" for s in secs)
        b = c.best
        print(
            f"{c.name:<28}{b.seconds:>8.2f}{changes / b.seconds:>10,.0f}"
            f"{b.cpu.get('consumer', 0):>7.1f}{b.cpu.get('publisher', 0):>8.1f}"
            f"   {runs:<21}{spread:>6.0%}"
        )
    recv, native, sa = (c.best.seconds for c in consumers)
    ratios = {"sparkapply/native": native / sa, "sparkapply/pg_recvlogical": recv / sa}
    print(
        f"rate ratio sparkapply/native: {ratios['sparkapply/native']:.2f}"
        f" (sparkapply takes {sa / native:.1f}x as long)"
    )
    print(
        f"rate ratio sparkapply/pg_recvlogical: {ratios['sparkapply/pg_recvlogical']:.2f}"
        f" (sparkapply takes {sa / recv:.1f}x as long)"
    )
    best = consumers[2].best
    if "receive" in best.phases:
        print(
            "sparkapply best run, wall s: "
            + ", ".join(f"{k} {v:.2f}" for k, v in best.phases.items() if k != "total")
        )
        cpu = best.detail.get("receive_thread_cpu_seconds")
        if cpu is not None:
            print(f"  receiving thread CPU during receive: {cpu:.2f}s")
    print(
        f"Spark session startup (not in the times above): {spark_startup:.1f}s,"
        f" + {spark_warmup:.1f}s warm-up job"
    )
    print(
        "CPU s: the consumer's processes (pg_recvlogical; the subscriber cluster;"
        " driver + JVM + Python workers); pub CPU: the publisher cluster"
    )
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload", choices=("bulk", "mixed", "update", "scatter"), default="bulk"
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=20_000, help="scatter: transactions")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per native run")
    parser.add_argument("--profile", action="store_true", help="two more sparkapply runs")
    parser.add_argument("--profile-dir", type=Path, help="write .pstats and .txt here")
    parser.add_argument(
        "--out", type=Path, help="JSON path (default bench/results/apply_<workload>_<rows>.json)"
    )
    args = parser.parse_args(argv)
    repeat = max(1, args.repeat)
    logging.basicConfig(level=logging.WARNING)
    out = args.out or (
        Path(__file__).resolve().parent / "results" / f"apply_{args.workload}_{args.rows}.json"
    )

    spark, spark_startup, spark_warmup = start_spark()
    log(f"Spark session {spark_startup:.1f}s, warm-up job {spark_warmup:.1f}s")

    tmp = Path(tempfile.mkdtemp(prefix="sparkapply-apply-bench-"))
    os.chmod(tmp, 0o755)
    pub = EmbeddedPostgres(tmp / "pub", settings=SETTINGS)
    sub = EmbeddedPostgres(tmp / "sub", settings=SUBSCRIBER_SETTINGS)
    consumers = [
        Consumer("pg_recvlogical"),
        Consumer("native (streaming=parallel)"),
        Consumer(f"sparkapply ({SPARK_MASTER})"),
    ]
    profile: dict[str, Any] | None = None
    pub.start()
    try:
        sub.start()
        pub_dsn, sub_dsn = pub.dsn(), sub.dsn()
        with psycopg.connect(pub_dsn, autocommit=True) as conn:
            conn.execute(DDL)
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
        with psycopg.connect(sub_dsn, autocommit=True) as conn:
            conn.execute(DDL)
        prefilled = args.rows if args.workload in PREFILLED else 0
        if prefilled:
            prefill(pub_dsn, prefilled)
        recv_slots = [f"recv_{i}" for i in range(repeat)]
        native_subs = [f"native_{i}" for i in range(repeat)]
        sa_slots = [f"sparkapply_{i}" for i in range(repeat)]
        prof_slots = ["sparkapply_timers", "sparkapply_cprofile"] if args.profile else []
        for slot in recv_slots:
            create_slot(pub_dsn, slot)
        for slot in [*sa_slots, *prof_slots]:
            prime_sparkapply(spark, pub, tmp, slot)
        for name in native_subs:
            create_subscription(sub_dsn, pub_dsn, name)

        backlog = write_backlog(pub_dsn, args.workload, args.rows, args.updates)
        log(
            f"backlog: {backlog.changes:,} changes in {backlog.transactions:,} transactions,"
            f" {backlog.wal_bytes / 1e6:.1f} MB of WAL, written in {backlog.seconds:.1f}s"
            f" (endpos {backlog.endpos}, target {backlog.target})"
        )

        for i in range(repeat):
            r = run_recvlogical(pub, recv_slots[i], backlog)
            consumers[0].runs.append(r)
            log(f"round {i + 1}: pg_recvlogical {r.seconds:.2f}s (load {r.load_before:.2f})")
            r = run_native(pub, sub, native_subs[i], backlog, args.timeout, prefilled)
            consumers[1].runs.append(r)
            log(f"round {i + 1}: native {r.seconds:.2f}s (load {r.load_before:.2f})")
            r = run_sparkapply(spark, pub, tmp, sa_slots[i], backlog)
            consumers[2].runs.append(r)
            phases = ", ".join(f"{k} {v:.2f}" for k, v in r.phases.items() if k != "total")
            log(
                f"round {i + 1}: sparkapply {r.seconds:.2f}s (load {r.load_before:.2f});"
                f" {r.detail['batches']} batches; {phases}"
            )
        if args.profile:
            profile = profile_runs(spark, pub, tmp, prof_slots, backlog, args.profile_dir)
    finally:
        sub.stop("immediate")
        pub.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()

    ratios = print_report(backlog, consumers, spark_startup, spark_warmup, repeat)
    if profile is not None:
        print_profile(profile)
    report = {
        "benchmark": "apply_bench",
        "workload": args.workload,
        "rows": args.rows,
        "repeat": repeat,
        "code": code_version(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "spark_master": SPARK_MASTER,
        },
        "settings": SETTINGS,
        "backlog": {
            "inserts": backlog.inserts,
            "updates": backlog.updates,
            "deletes": backlog.deletes,
            "changes": backlog.changes,
            "transactions": backlog.transactions,
            "wal_bytes": backlog.wal_bytes,
            "write_seconds": round(backlog.seconds, 3),
            "expected": backlog.expected.as_json() if backlog.expected else None,
        },
        "spark_session_startup_seconds": round(spark_startup, 3),
        "spark_warmup_job_seconds": round(spark_warmup, 3),
        "consumers": {c.name: c.summary(backlog.changes) for c in consumers},
        "rate_ratios": {k: round(v, 3) for k, v in ratios.items()},
    }
    if profile is not None:
        report["profile"] = profile
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=_json_default) + "\n")
    log(f"wrote {out}")
    return 0


def print_profile(profile: dict[str, Any]) -> None:
    t = profile["timers_run"]
    print(f"\nprofile run with executor timers: {t['seconds']:.2f}s")
    for k, v in t["driver_phases"].items():
        print(f"  driver   {k:<42}{v:>8.2f}s")
    for k, v in t["executor_phases"].items():
        print(f"  executor {k:<42}{v:>8.2f}s")
    c = profile["cprofile_run"]
    print(f"cProfile run: {c['seconds']:.2f}s (cProfile inflates Python-heavy code)")
    for title, key in (
        ("driver receiving thread", "driver_receive_thread_top"),
        ("executor task", "executor_task_top"),
    ):
        print(f"  top of {title} by own time:")
        for row in c[key][:12]:
            print(
                f"    {row['tottime']:>7.2f}s own {row['cumtime']:>7.2f}s cum "
                f"{row['calls']:>10,}  {row['function']}"
            )


def code_version() -> dict[str, Any]:
    """The commit measured, and the package files that differ from it (shared tree)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return proc.stdout.rstrip("\n")

    dirty = [line[3:] for line in git("status", "--porcelain", "sparkapply").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "uncommitted": dirty}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _json_default(value: object) -> object:
    if isinstance(value, Decimal | Lsn):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    return repr(value)


if __name__ == "__main__":
    raise SystemExit(main())
