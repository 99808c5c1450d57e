"""The subscriber: the loop that ties source, assembly, apply and acknowledgement together.

THREADS
    The receiving thread (the caller of :meth:`Subscriber.run`) owns the replication
    connection: it reads messages, feeds the assembler, answers keepalives and sends
    status updates. One apply thread runs a batch at a time (Spark job + Iceberg
    commits). While it runs, the receiving thread keeps reading into the spool, so the
    walsender never times out and the next batch is ready when the apply finishes.

ACKNOWLEDGEMENT
    :class:`~sparkapply.changes.progress.Progress` holds the end LSN of every
    transaction in receive order; an item is done when its batch committed (or, for
    PREPARE, when it was staged). The flush LSN sent is the longest done prefix. When
    nothing is pending and no ordinary transaction is half received, it follows the
    server's position, so a publication whose tables are idle does not retain WAL.

BATCHES
    When a batch is cut, what it acknowledges when it completes, and when the
    subscriber is idle are :class:`~sparkapply.plan.scheduler.BatchScheduler`'s (it also
    drops a transaction ``sparkapply skip`` names). This module runs the loop around
    it: receive bursts, hand batches to the apply thread, send positions. A session's
    parts are made in :mod:`sparkapply.run.session`, a batch is applied by
    :mod:`sparkapply.run.batch`.

READING AHEAD
    While the subscriber is idle, the apply thread reads the files the next batch will
    search for the rows it replaces (``run/session.py``, ``ApplyJob.warm``): after a
    quiet spell the first batch is the one a user waits for, and it found the files
    cold. A batch (or copy) submitted meanwhile stops the read ahead after the file it
    is reading.

STOPPING
    ``stop()`` (SIGTERM, Ctrl-C) lets the running batch finish (its acknowledgement is
    sent) and abandons the rest: it is only in the spool, and the server sends it again.

ERRORS
    An error whose kind is TRANSIENT (a dropped connection, a catalog commit conflict,
    a lost Spark executor) ends the session; the next one starts after a backoff from
    the slot's confirmed position, with fresh caches, so nothing is lost or applied
    twice. Any other error stops the run. An apply error names the transaction (xid,
    commit LSN) and table, and says how to skip it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkapply import collector
from sparkapply.config import Config
from sparkapply.copy.driver import PUBLICATION_CHECK_INTERVAL, TableCopier
from sparkapply.errors import ErrorKind, SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.lsn import INVALID_LSN, Lsn
from sparkapply.metrics import Metrics
from sparkapply.pgoutput.frames import XLOG_DATA_HEADER
from sparkapply.plan.scheduler import Batch, BatchScheduler
from sparkapply.run.batch import BatchStats
from sparkapply.run.errors import outcome
from sparkapply.run.session import Session, SlotPolicy, copy_first, streaming
from sparkapply.source.connection import ReplicationConnection, connect
from sparkapply.source.negotiation import Protocol
from sparkapply.source.publisher import PublishedTable, check_publisher
from sparkapply.source.stream import ReplicationStream
from sparkapply.state.batch_log import BatchLog
from sparkapply.state.presence import living
from sparkapply.state.run_state import RunState, RunStateFile

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# How long a read waits for the walsender: while committed transactions wait to be
# cut, a read that finds nothing in this time is a pause of the stream, which cuts the
# batch (the walsender's keepalive at the end of a backlog says so sooner, when it
# comes: see source/stream.py, ``caught_up``); otherwise, until a keepalive is due.
PAUSE_WAIT = 0.02
IDLE_WAIT = 0.2


@dataclass(slots=True)
class RunSummary:
    """What a run has done so far (read while it runs, and returned by ``run``)."""

    batches: int = 0
    transactions: int = 0
    changes: int = 0
    flushed: Lsn = INVALID_LSN
    reconnects: int = 0  # sessions ended by a transient error and started again
    skipped: int = 0  # transactions dropped by `sparkapply skip`
    staged_rows: int = 0  # rows committed from files staged while their transaction arrived
    streaming_started: float = 0.0  # time.monotonic() at the last START_REPLICATION


class Subscriber:
    """The run: replication sessions one after another, until stopped (see ERRORS)."""

    # Seconds between looks at the publication's tables (new ones are copied).
    publication_check_interval: float = PUBLICATION_CHECK_INTERVAL

    def __init__(
        self,
        config: Config,
        *,
        spark: SparkSession | None = None,
        catalog: Catalog | None = None,
        on_batch: Callable[[BatchStats], None] | None = None,
    ) -> None:
        self.config = config
        # Called on the receiving thread with each applied batch's stats (timings
        # included), once it has completed: how benchmarks and tools observe a run.
        self.on_batch = on_batch
        self._spark = spark
        self._catalog = catalog
        self._stop = threading.Event()
        self.summary = RunSummary()
        self._copier: TableCopier | None = None
        self._published: list[PublishedTable] = []
        self.metrics = Metrics(config.metrics, config.work_dir, config.source)
        self._state = RunStateFile(config.work_dir)
        self._batches = BatchLog(config.work_dir)
        self._until_cut: Lsn | None = None

    def stop(self) -> None:
        self._stop.set()

    @property
    def state(self) -> RunState:
        """What the run is doing, as ``run.json`` says it (state/run_state.py)."""
        return self._state.current

    @property
    def catalog(self) -> Catalog | None:
        """The Iceberg catalog the run writes to (opened by :meth:`run` if not given)."""
        return self._catalog

    # -- setup ------------------------------------------------------------------------

    def _open_sinks(self) -> tuple[SparkSession, Catalog]:
        if self._catalog is None:
            from sparkapply.sink.catalog import open_catalog

            self._catalog = open_catalog(
                self.config.sink.catalog_name, self.config.catalog_properties()
            )
        if self._spark is None:
            from sparkapply.apply.session import get_session, warm_workers

            self._spark = get_session(
                self.config.spark.master, self.config.spark.app_name, self.config.spark.conf
            )
            warm_workers(self._spark)
        return self._spark, self._catalog

    def _target_lsn(self) -> Lsn:
        # The insert position, not pg_current_wal_lsn(): with synchronous_commit off a
        # committed transaction's record may not be written yet.
        src = self.config.source
        with connect(src.dsn, connect_timeout=src.connect_timeout) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(row[0])

    # -- sessions -----------------------------------------------------------------------

    def run(self, *, until_caught_up: bool = False, until_cut: Lsn | None = None) -> RunSummary:
        """Replicate until :meth:`stop` (or, with ``until_caught_up``, until everything
        committed before the call is applied and acknowledged; with ``until_cut``,
        until the batch serving the requested cut at that LSN has completed: see
        :mod:`sparkapply.run.exact_cut`)."""
        self._until_cut = until_cut
        # For as long as it lives, also between sessions: verify must not take its slot.
        with living(self.config.work_dir):
            return self._run(until_caught_up)

    def _run(self, until_caught_up: bool) -> RunSummary:
        src = self.config.source
        try:
            protocol, self._published = check_publisher(src.dsn, src.publication)
            spark, catalog = self._open_sinks()
            target = self._target_lsn() if until_caught_up else None
            self.metrics.serve()
            self._sessions(protocol, spark, catalog, target)
        except BaseException as exc:
            self._state.enter("failed", _first_line(exc))
            raise
        finally:
            self.metrics.close()
        self._state.enter("stopped")
        return self.summary

    def _sessions(
        self, protocol: Protocol, spark: SparkSession, catalog: Catalog, target: Lsn | None
    ) -> None:
        """One session after another, until one ends the run; a transient error ends
        a session, and the next starts after a backoff."""
        backoff = 1.0
        while not self._stop.is_set():
            flushed = self.summary.flushed
            try:
                if self._session(protocol, spark, catalog, target):
                    return
            except SparkapplyError as exc:
                # By kind, not by class: whatever may succeed when tried again is.
                if exc.kind is not ErrorKind.TRANSIENT:
                    raise
                if self.summary.flushed > flushed:
                    backoff = 1.0  # the session made progress: not a persistent fault
                log.warning("%s; starting again in %.0fs", exc, backoff)
                self.summary.reconnects += 1
                self._state.enter("retrying", _first_line(exc))
                self.metrics.retrying(self._state.current.since)
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self.config.source.reconnect_max_backoff)

    def _session(
        self, protocol: Protocol, spark: SparkSession, catalog: Catalog, target: Lsn | None
    ) -> bool:
        """One replication session (see ERRORS); True when the run is to end."""
        cfg = self.config
        cfg.work_dir.mkdir(parents=True, exist_ok=True)
        conn = ReplicationConnection(cfg.source.dsn, connect_timeout=cfg.source.connect_timeout)
        try:
            check = self.publication_check_interval
            policy = SlotPolicy(
                reconnecting=self.summary.reconnects > 0, on_missing=self.metrics.slot_missing.inc
            )
            slot, copier = copy_first(cfg, conn, protocol, spark, catalog, check, policy)
            self._copier = copier
            with streaming(
                cfg, conn, slot, protocol, copier, self._published, spark, catalog
            ) as session:
                self.summary.streaming_started = session.streaming_started
                self._state.enter("streaming")
                self.metrics.retrying(None)
                return self._loop(session, target)
        finally:
            conn.close()

    # -- the loop -----------------------------------------------------------------------

    def _loop(self, session: Session, target: Lsn | None) -> bool:
        """Receive, hand batches to the apply thread, send what they made durable; True
        when the run is to end (stopped, or caught up with ``target``)."""
        scheduler, stream, job = session.scheduler, session.stream, session.job
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkapply-apply")
        running: Future[tuple[BatchStats, float]] | None = None
        copying: Future[None] | None = None  # the periodic check for newly published tables
        warming: Future[None] | None = None  # reading ahead while idle (READING AHEAD)
        warm_stop = threading.Event()
        last_ping = 0.0
        try:
            while True:
                # Transactions wait for the stream to pause before they are cut: look
                # again soon. A running batch or copy ends the wait when it is done.
                waiting = running is None and session.assembler.backlog().transactions > 0
                self._receive(session, PAUSE_WAIT if waiting else IDLE_WAIT)
                if running is not None and running.done():
                    self._completed(session, running)  # raises: nothing acknowledged
                    running = None

                if copying is not None and copying.done():
                    copying.result()  # re-raises the copy's error
                    copying = None
                elif running is None and not self._stop.is_set() and job.copier.due():
                    # Same single-threaded pool: batches queue behind the copy.
                    warm_stop.set()
                    copying = pool.submit(job.refresh)
                    self._wake_when_done(session, copying)

                if warming is not None and warming.done():
                    warming.result()  # its failures are logged where it ran
                    warming = None

                if self._stop.is_set():
                    scheduler.stop()
                    warm_stop.set()
                if scheduler.may_exit():
                    stream.set_flush_lsn(session.progress.flushed)
                    stream.send_status()
                    return True

                batch = scheduler.cut()
                if batch is not None:
                    warm_stop.set()  # a read ahead before it in the pool ends at once
                    running = pool.submit(job.apply, batch)
                    self._wake_when_done(session, running)
                elif (
                    warming is None
                    and running is None
                    and copying is None
                    and not self._stop.is_set()
                    and scheduler.idle()
                    and job.wants_warming()
                ):
                    warm_stop.clear()
                    warming = pool.submit(job.warm, warm_stop.is_set)

                idle = self._positions(session)
                # Past the cuts of the copies this session made (copy/commit.py), too.
                through = None if target is None else max([target, *job.copier.cuts_requested])
                if through is not None and idle and scheduler.caught_up(through):
                    stream.send_status()
                    return True
                # Waiting for the server's position (to exit, or to make a requested
                # cut): an idle walsender reports it only when asked.
                waiting = target is not None or scheduler.cut_requested()
                if idle and waiting and time.monotonic() - last_ping > 1.0:
                    stream.send_status(reply_requested=True)
                    last_ping = time.monotonic()
        finally:
            warm_stop.set()
            if running is not None:
                running.cancel()
                with contextlib.suppress(Exception):
                    running.result()
            pool.shutdown(wait=True)
            if job.maintenance is not None:
                job.maintenance.close()

    @staticmethod
    def _wake_when_done(session: Session, future: Future[Any]) -> None:
        """The receiving thread comes back from its wait as soon as ``future`` is done,
        so that a batch is acknowledged (and the next one cut) at once."""
        wakeup = session.stream.wakeup
        if wakeup is not None:
            future.add_done_callback(lambda _: wakeup.set())

    def _receive(self, session: Session, timeout: float) -> None:
        """One burst of messages into the assembler; a short wait while there is work."""
        with collector.paused():
            frames = session.stream.poll_burst(timeout)
            session.assembler.feed_frames(frames, XLOG_DATA_HEADER.size)
            got = bool(frames)
            del frames  # freed before the collector may look at them
        session.scheduler.received(got, session.stream.caught_up)

    def _completed(self, session: Session, running: Future[tuple[BatchStats, float]]) -> None:
        """The apply thread finished a batch: it is done in the progress (acknowledged
        with the next status), or its error is raised and nothing of it is. The run
        stops after the requested cut it was to reach."""
        scheduler = session.scheduler
        batch = scheduler.running
        assert batch is not None
        stats, seconds = outcome(running, batch)
        failpoint("before-ack")
        scheduler.complete(batch)
        if batch.requested is not None and not batch.items:
            scheduler.cut_recorded(batch.requested)
            if batch.requested == self._until_cut:
                self.stop()
        else:
            self._account(batch, stats, seconds, session.progress.flushed)
        if session.job.maintenance is not None:
            session.job.maintenance.poke()  # beside the apply: never delays the next

    def _positions(self, session: Session) -> bool:
        """The flush LSN to send (following the server's position when idle), recorded
        in the summary and the metrics; True when the subscriber is idle."""
        scheduler, stream, progress = session.scheduler, session.stream, session.progress
        idle = scheduler.idle()
        if idle:
            progress.follow(stream.last_received)
        stream.set_flush_lsn(progress.flushed)
        self.summary.flushed = progress.flushed
        self.metrics.positions(stream.last_received, progress.flushed, idle=idle)
        if scheduler.skipped_through is not None:
            self._after_skip(stream, scheduler, progress.flushed)
        return idle

    def _account(self, batch: Batch, stats: BatchStats, seconds: float, flushed: Lsn) -> None:
        self.summary.batches += 1
        self.summary.transactions += len(batch)
        self.summary.changes += stats.changes
        self.summary.staged_rows += stats.staged_rows
        self.metrics.batch_done(batch.txns, stats, seconds)
        self._state.batch_done()
        if self.on_batch is not None:
            self.on_batch(stats)
        path = "job" if any(r.tasks for r in stats.results) else "driver_fold"
        self._batches.append(
            flushed,
            transactions=len(batch),
            changes=stats.changes,
            staged_rows=stats.staged_rows,
            tables=stats.tables,
            seconds=round(seconds, 6),
            plan_seconds=round(stats.plan_seconds, 6),
            job_seconds=round(stats.job_seconds, 6),
            commit_seconds=round(stats.commit_seconds, 6),
            path=path,
        )
        log.info(
            "applied %d transactions (%d changes%s) to %d tables in %.2fs; flushed to %s "
            "(plan %.3fs, %s %.3fs, commit %.3fs)",
            len(batch),
            stats.changes,
            f", {stats.staged_rows} rows staged while they arrived" if stats.staged_rows else "",
            stats.tables,
            seconds,
            flushed,
            stats.plan_seconds,
            path,
            stats.job_seconds,
            stats.commit_seconds,
        )

    def _after_skip(
        self, stream: ReplicationStream, scheduler: BatchScheduler, flushed: Lsn
    ) -> None:
        """Remove the skip record once the publisher has been told the skipped
        transaction is done (until then a restart must skip it again)."""
        through = scheduler.skipped_through
        if through is None:
            return
        if flushed >= through:
            stream.send_status()
            scheduler.forget_skip()
            self.summary.skipped += 1
            self.metrics.skipped.inc()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]
