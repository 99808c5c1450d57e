"""sparkapply as a benchmark consumer: its Spark session, its configuration, its runs.

A run is ``Subscriber(config, spark=session, on_batch=...).run(until_caught_up=True)``
on a work dir and SQLite catalog of its own. Where its time went comes from what the
package records (``BatchStats``: start, end, planning, Spark job and commit seconds;
``TableResult.timings``: the task's phases; ``RunSummary.streaming_started``), and
the receiving thread's CPU from its CPU clock: nothing is wrapped or patched.
"""

from __future__ import annotations

import cProfile
import importlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from benchlib.consumers import Run
from benchlib.metering import CpuMeter, ThreadCpuSampler, loadavg, peak_rss_mib, reset_peak_rss
from benchlib.servers import PUBLICATION, postmaster_pid
from benchlib.workloads import Backlog, iceberg_checksum
from sparkapply.config import Config
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.run.batch import BatchStats

SPARK_MASTER = "local[2]"
SPARK_CONF = {"spark.driver.memory": "2g"}
# Spark's Python profiler: cProfile around every task of the session's RDD jobs.
PROFILE_CONF = {"spark.python.profile": "true"}


def start_spark(app: str, conf: dict[str, str] | None = None) -> tuple[Any, float, float]:
    """The session, its startup seconds, and those of a warm-up job that starts the
    Python workers and imports the apply and copy tasks in them (a long-lived driver
    pays both once, so no run counts them)."""
    from sparkapply.apply.session import get_session

    t = time.perf_counter()
    spark = get_session(SPARK_MASTER, app, {**SPARK_CONF, **(conf or {})})
    startup = time.perf_counter() - t
    t = time.perf_counter()
    modules = ["sparkapply.apply.tasks", "sparkapply.copy.tasks"]
    # import_module is pickled by reference: the workers need nothing from bench/.
    spark.sparkContext.parallelize(modules * 2, 2).map(importlib.import_module).count()
    return spark, startup, time.perf_counter() - t


def sparkapply_config(dsn: str, work_dir: Path, slot: str) -> Config:
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


def phases(t0: float, t1: float, started: float, batches: list[BatchStats]) -> dict[str, float]:
    """Where a run's wall time went, from the driver's point of view (monotonic times).

    setup: run() until START_REPLICATION (preflight, catalog, slot, initial copy).
    receive: START_REPLICATION until the first batch starts (with one big
        transaction: the whole stream decoded, peeked and spooled).
    plan / spark_job / iceberg_commit / other_apply: summed over batches; plan is the
        applier's own (table load, file listing, tasks), other_apply the rest.
    receive_overlapped: time after the first batch when no batch was running.
    tail: the last batch's end until run() returned (acknowledge, catch-up check).
    """
    if not started:
        return {"total": t1 - t0}
    if not batches:  # nothing streamed: setup is the initial copy, if there was one
        return {"total": t1 - t0, "setup": started - t0, "tail": t1 - started}
    first, last = batches[0].started, batches[-1].finished
    plan = sum(b.plan_seconds for b in batches)
    job = sum(b.job_seconds for b in batches)
    commit = sum(b.commit_seconds for b in batches)
    applying = sum(b.finished - b.started for b in batches)
    return {
        "total": t1 - t0,
        "setup": started - t0,
        "receive": first - started,
        "plan": plan,
        "spark_job": job,
        "iceberg_commit": commit,
        "other_apply": applying - plan - job - commit,
        "receive_overlapped": (last - first) - applying,
        "tail": t1 - last,
    }


def executor_phases(batches: list[BatchStats]) -> dict[str, float]:
    """The tasks' own phase seconds (``TableResult.timings``), summed over tables and
    batches, and the tasks' wall seconds (the longest partition of each table)."""
    out: dict[str, float] = {}
    for stats in batches:
        for r in stats.results:
            for phase, seconds in [*r.timings.items(), ("task", r.seconds)]:
                out[phase] = out.get(phase, 0.0) + seconds
    return {k: round(v, 3) for k, v in out.items()}


class Sparkapply:
    """The consumer's CPU is this process's tree: driver, JVM, Python workers.

    ``streamed``: the backlog comes through the stream, so each round's slot is primed
    (a first run on the still empty table creates its slot, work dir and Iceberg
    table) before it is written; otherwise (the copy benchmark) each round starts
    from nothing and copies the table.
    """

    name = f"sparkapply ({SPARK_MASTER})"

    def __init__(
        self, spark: Any, pub: EmbeddedPostgres, root: Path, slots: list[str], *, streamed: bool
    ) -> None:
        self.spark, self.pub, self.root = spark, pub, root
        self.slots = list(slots)
        self.streamed = streamed
        self.profile: cProfile.Profile | None = None  # the receiving thread, if set

    def prepare(self) -> None:
        from sparkapply.run.subscriber import Subscriber

        for slot in self.slots if self.streamed else ():
            Subscriber(self._config(slot), spark=self.spark).run(until_caught_up=True)

    def _config(self, slot: str) -> Config:
        return sparkapply_config(self.pub.dsn(), self.root / f"work-{slot}", slot)

    def run(self, backlog: Backlog) -> Run:
        from sparkapply.run.subscriber import Subscriber

        slot = self.slots.pop(0)
        config = self._config(slot)
        batches: list[BatchStats] = []
        sub = Subscriber(config, spark=self.spark, on_batch=batches.append)
        load = loadavg()
        sampler = ThreadCpuSampler(threading.current_thread())
        reset_peak_rss()
        with sampler, CpuMeter(os.getpid(), postmaster_pid(self.pub)) as cpu:
            t0 = time.monotonic()
            if self.profile is not None:
                self.profile.enable()
            try:
                summary = sub.run(until_caught_up=True)
            finally:
                if self.profile is not None:
                    self.profile.disable()
            t1 = time.monotonic()
        peak_rss = peak_rss_mib()  # the driver's Python process (the JVM is another)
        got = iceberg_checksum(sub.catalog, backlog.table, backlog.amount)
        backlog.verify(f"sparkapply {slot}", got)
        if self.streamed and summary.changes != backlog.changes:
            raise SystemExit(  # the rows must have come through the stream
                f"sparkapply {slot} applied {summary.changes:,} changes from the stream,"
                f" expected {backlog.changes:,}"
            )
        spool = sum(f.stat().st_size for f in (config.work_dir / "spool").glob("*") if f.is_file())
        receive_cpu = (
            sampler.between(summary.streaming_started, batches[0].started) if batches else None
        )
        detail = {
            "batches": summary.batches,
            "transactions": summary.transactions,
            "changes": summary.changes,
            "rows_written": sum(b.rows_written for b in batches),
            "rows_removed": sum(b.rows_removed for b in batches),
            "files_added": sum(len(r.added) for b in batches for r in b.results),
            "files_removed": 0,  # merge-on-read: nothing is rewritten
            "delete_files_added": sum(len(r.deletes) for b in batches for r in b.results),
            "spool_bytes_left": spool,
            "receive_thread_cpu_seconds": None if receive_cpu is None else round(receive_cpu, 3),
            "executor_phases": executor_phases(batches),
            "staged_rows": summary.staged_rows,
            "driver_peak_rss_mib": None if peak_rss is None else round(peak_rss),
            "verified": got.as_json(),
        }
        with psycopg.connect(self.pub.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        shutil.rmtree(config.work_dir, ignore_errors=True)
        return Run(
            t1 - t0, load, cpu.as_dict(), phases(t0, t1, summary.streaming_started, batches), detail
        )
