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
    it: receive bursts, hand batches to the apply thread, send positions.

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
from typing import TYPE_CHECKING

import psycopg

from sparkapply import collector
from sparkapply.apply.batch import Applier, BatchStats
from sparkapply.apply.tasks import internal_error
from sparkapply.changes.assembler import Assembler
from sparkapply.changes.cut_requests import CutRequests
from sparkapply.changes.prepared import PreparedStore
from sparkapply.changes.progress import Progress
from sparkapply.changes.skip import SkipStore
from sparkapply.config import Config
from sparkapply.convert.schema import relation_identifier
from sparkapply.copy.driver import PUBLICATION_CHECK_INTERVAL, TableCopier
from sparkapply.errors import ErrorKind, InternalError, SparkapplyError, SparkJobError
from sparkapply.failpoints import failpoint
from sparkapply.lsn import INVALID_LSN, Lsn
from sparkapply.maintain.background import BackgroundMaintenance
from sparkapply.maintain.maintainer import Maintainer
from sparkapply.metrics import Metrics
from sparkapply.pgoutput.frames import XLOG_DATA_HEADER
from sparkapply.plan.scheduler import Batch, BatchScheduler
from sparkapply.sink.atomic import atomic_commits, commit_mode
from sparkapply.sink.cuts import CutLog, cuts_identifier
from sparkapply.source.connection import ReplicationConnection
from sparkapply.source.negotiation import Protocol, start_replication_command
from sparkapply.source.publisher import PublishedTable, check_publisher, ensure_slot
from sparkapply.source.stream import ReplicationStream
from sparkapply.staging.records import sweep_staged
from sparkapply.staging.stager import Stager
from sparkapply.state.layout import prepared_dir

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RunSummary:
    batches: int = 0
    transactions: int = 0
    changes: int = 0
    flushed: Lsn = INVALID_LSN
    reconnects: int = 0  # sessions ended by a transient error and started again
    skipped: int = 0  # transactions dropped by `sparkapply skip`
    staged_rows: int = 0  # rows committed from files staged while their transaction arrived
    streaming_started: float = 0.0  # time.monotonic() at the last START_REPLICATION


class Subscriber:
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
        self.metrics = Metrics(config.metrics, config.work_dir)

    def stop(self) -> None:
        self._stop.set()

    @property
    def catalog(self) -> Catalog | None:
        """The Iceberg catalog the run writes to (opened by :meth:`run` if not given)."""
        return self._catalog

    # -- setup ------------------------------------------------------------------------

    def _cut_log(self, catalog: Catalog) -> CutLog | None:
        """The record of cuts (sink/cuts.py), naming every published table."""
        sink = self.config.sink
        if not sink.cuts_table:
            return None
        to_source = {ice: pg for pg, ice in sink.tables.items()}
        cuts = CutLog(
            catalog,
            cuts_identifier(sink.cuts_table),
            retain_seconds=self.config.maintenance.retain_seconds,
            source_names=lambda ident: to_source.get(".".join(ident), ".".join(ident)),
        )
        cuts.track(self.config.table_identifier(t.schema, t.name) for t in self._published)
        return cuts

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
        with psycopg.connect(self.config.source.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(row[0])

    # -- sessions -----------------------------------------------------------------------

    def run(self, *, until_caught_up: bool = False) -> RunSummary:
        """Replicate until :meth:`stop` (or, with ``until_caught_up``, until everything
        committed before the call is applied and acknowledged)."""
        src = self.config.source
        protocol, self._published = check_publisher(src.dsn, src.publication)
        spark, catalog = self._open_sinks()
        target = self._target_lsn() if until_caught_up else None
        self.metrics.serve()
        backoff = 1.0
        try:
            while not self._stop.is_set():
                flushed = self.summary.flushed
                try:
                    if self._session(protocol, spark, catalog, target):
                        break
                except SparkapplyError as exc:
                    # By kind, not by class: whatever may succeed when tried again is.
                    if exc.kind is not ErrorKind.TRANSIENT:
                        raise
                    if self.summary.flushed > flushed:
                        backoff = 1.0  # the session made progress: not a persistent fault
                    log.warning("%s; starting again in %.0fs", exc, backoff)
                    self.summary.reconnects += 1
                    self.metrics.reconnects.inc()
                    if self._stop.wait(backoff):
                        break
                    backoff = min(backoff * 2, src.reconnect_max_backoff)
        finally:
            self.metrics.close()
        return self.summary

    def _session(
        self, protocol: Protocol, spark: SparkSession, catalog: Catalog, target: Lsn | None
    ) -> bool:
        cfg = self.config
        src = cfg.source
        work = cfg.work_dir
        work.mkdir(parents=True, exist_ok=True)
        conn = ReplicationConnection(src.dsn, connect_timeout=src.connect_timeout)
        stager: Stager | None = None
        try:
            slot = ensure_slot(
                conn,
                src.slot,
                create=src.create_slot,
                two_phase=protocol.two_phase,
                snapshot="export",
            )
            if slot.created:
                log.info("created replication slot %s at %s", slot.name, slot.consistent_point)
            # Copy what is not yet in Iceberg before streaming (the exported snapshot
            # lives until the next command on conn); see sparkapply.copy.driver.
            copier = TableCopier(
                cfg, spark, catalog, check_interval=self.publication_check_interval
            )
            slot = copier.before_streaming(conn, slot, two_phase=protocol.two_phase)
            self._copier = copier
            progress = Progress(slot.confirmed_flush)
            prepared = PreparedStore(prepared_dir(work))
            sweep_staged(work, catalog)
            table_map = dict(cfg.sink.tables)
            stager = Stager(
                spark,
                catalog,
                lambda rel: relation_identifier(rel, table_map),
                work_dir=work,
                stage_bytes=cfg.apply.stage_bytes,
                inflight_bytes=cfg.apply.stage_inflight_bytes,
                proto_version=protocol.proto_version,
                streaming=protocol.streaming,
            )
            assembler = Assembler(
                work,
                proto_version=protocol.proto_version,
                streaming=protocol.streaming,
                prepared=prepared,
                progress=progress,
                stager=stager,
            )
            cuts = self._cut_log(catalog)
            applier = Applier(
                spark,
                catalog,
                table_map=table_map,
                proto_version=protocol.proto_version,
                streaming=protocol.streaming,
                retain_snapshots=cfg.sink.retain_snapshots,
                free_expired_files=cfg.maintenance.enabled,
                split_bytes=cfg.apply.split_bytes,
                max_tasks_per_table=cfg.apply.max_tasks_per_table,
                driver_fold_bytes=cfg.apply.driver_fold_bytes,
                atomic=cfg.sink.atomic_commit and atomic_commits(catalog),
                cuts=cuts,
            )
            if cuts is not None:
                applier.locks.listeners.append(cuts.changed)
            log.info(
                "batches commit %s",
                commit_mode(catalog) if cfg.sink.atomic_commit else "table by table (configured)",
            )
            scheduler = BatchScheduler(
                assembler,
                progress,
                cfg.apply,
                skips=SkipStore(work),
                prepared=prepared,
                cut_requests=CutRequests(work) if cuts is not None else None,
            )
            stream = ReplicationStream(conn, status_interval=src.status_interval)
            self.summary.streaming_started = time.monotonic()
            stream.start(
                start_replication_command(
                    slot.name, Lsn(0), src.publication, protocol, origin=src.origin
                ),
                slot.confirmed_flush,
            )
            maintenance = (
                BackgroundMaintenance(
                    Maintainer(
                        cfg.maintenance,
                        spark,
                        catalog,
                        locks=applier.locks,
                        protected=cuts.protected if cuts is not None else None,
                    ),
                    applier.known_tables,
                    retain_snapshots=cfg.sink.retain_snapshots,
                )
                if cfg.maintenance.enabled
                else None
            )
            if maintenance is not None:
                applier.expire_beside = maintenance.expire_later
            job = _ApplyJob(applier, copier, maintenance)
            return self._loop(stream, assembler, progress, scheduler, job, target)
        finally:
            if stager is not None:
                stager.close()
            conn.close()

    # -- the loop -----------------------------------------------------------------------

    def _loop(
        self,
        stream: ReplicationStream,
        assembler: Assembler,
        progress: Progress,
        scheduler: BatchScheduler,
        job: _ApplyJob,
        target: Lsn | None,
    ) -> bool:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkapply-apply")
        running: Future[tuple[BatchStats, float]] | None = None
        copying: Future[None] | None = None  # the periodic check for newly published tables
        last_ping = 0.0
        try:
            while True:
                busy = running is not None or assembler.backlog().transactions > 0
                with collector.paused():
                    frames = stream.poll_burst(0.05 if busy else 0.2)
                    assembler.feed_frames(frames, XLOG_DATA_HEADER.size)
                    got = bool(frames)
                    del frames  # freed before the collector may look at them
                scheduler.received(got)

                if running is not None and running.done():
                    batch = scheduler.running
                    assert batch is not None
                    stats, seconds = _outcome(running, batch)  # raises: nothing acknowledged
                    running = None
                    failpoint("before-ack")
                    scheduler.complete(batch)
                    if batch.requested is not None and not batch.items:
                        scheduler.cut_recorded(batch.requested)
                    else:
                        self._account(batch, stats, seconds, progress.flushed)
                    if job.maintenance is not None:
                        job.maintenance.poke()  # beside the apply: never delays the next

                if copying is not None and copying.done():
                    copying.result()  # re-raises the copy's error
                    copying = None
                elif running is None and not self._stop.is_set() and job.copier.due():
                    # Same single-threaded pool: batches queue behind the copy.
                    copying = pool.submit(job.refresh)

                if self._stop.is_set():
                    scheduler.stop()
                if scheduler.may_exit():
                    stream.set_flush_lsn(progress.flushed)
                    stream.send_status()
                    return True

                batch = scheduler.cut()
                if batch is not None:
                    running = pool.submit(job.apply, batch)

                idle = scheduler.idle()
                if idle:
                    progress.follow(stream.last_received)
                stream.set_flush_lsn(progress.flushed)
                self.summary.flushed = progress.flushed
                self.metrics.positions(stream.last_received, progress.flushed, idle=idle)
                if scheduler.skipped_through is not None:
                    self._after_skip(stream, scheduler, progress.flushed)

                if target is not None and idle and scheduler.caught_up(target):
                    stream.send_status()
                    return True
                # Waiting for the server's position (to exit, or to make a requested
                # cut): an idle walsender reports it only when asked.
                waiting = target is not None or scheduler.cut_requested()
                if idle and waiting and time.monotonic() - last_ping > 1.0:
                    stream.send_status(reply_requested=True)
                    last_ping = time.monotonic()
        finally:
            if running is not None:
                running.cancel()
                with contextlib.suppress(Exception):
                    running.result()
            pool.shutdown(wait=True)
            if job.maintenance is not None:
                job.maintenance.close()

    def _account(self, batch: Batch, stats: BatchStats, seconds: float, flushed: Lsn) -> None:
        self.summary.batches += 1
        self.summary.transactions += len(batch)
        self.summary.changes += stats.changes
        self.summary.staged_rows += stats.staged_rows
        self.metrics.batch_done(batch.txns, stats, seconds)
        if self.on_batch is not None:
            self.on_batch(stats)
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
            "job" if any(r.tasks for r in stats.results) else "driver_fold",
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


class _ApplyJob:
    """What the apply thread runs: the copy of tables seen for the first time, then the
    batch. The copier and the applier do not know each other; the tables a copy
    committed are dropped from the applier's cache here."""

    def __init__(
        self,
        applier: Applier,
        copier: TableCopier,
        maintenance: BackgroundMaintenance | None = None,
    ) -> None:
        self.applier = applier
        self.copier = copier
        self.maintenance = maintenance

    def apply(self, batch: Batch) -> tuple[BatchStats, float]:
        started = time.monotonic()
        if batch.requested is not None and not batch.items:
            self._forget_copied()
            self.applier.record_requested_cut(batch.requested)
            return BatchStats(), time.monotonic() - started
        txns = batch.txns
        self.copier.before_batch(txns)
        self._forget_copied()
        try:
            stats = self.applier.apply(txns)
        except SparkapplyError:
            raise
        except Exception as exc:
            lost = spark_job_error(exc)
            if lost is None:  # a bug in the driver's half of the apply
                lsns = [int(t.commit_lsn) for t in txns]
                raise internal_error(exc, None, lsns) from exc
            raise lost from exc
        return stats, time.monotonic() - started

    def refresh(self) -> None:
        self.copier.refresh()
        self._forget_copied()

    def _forget_copied(self) -> None:
        for ident in self.copier.take_copied():
            self.applier.forget(ident)


def spark_job_error(exc: BaseException) -> SparkJobError | None:
    """A failure of Spark itself (Py4J, a lost executor or Python worker, a cancelled
    job) as a transient error; None for anything else (a bug in our driver code). Our
    task code returns its own errors as values, so they never arrive here."""
    module = type(exc).__module__ or ""
    if not module.startswith(("py4j", "pyspark")):
        return None
    first = (str(exc).strip().splitlines() or [""])[0][:500]
    return SparkJobError(
        f"the batch's Spark job failed: {type(exc).__name__}: {first}",
        hint="nothing of the batch was committed or acknowledged; it is applied again "
        "from the publisher's stream when the session starts again",
    )


def _outcome(fut: Future[tuple[BatchStats, float]], batch: Batch) -> tuple[BatchStats, float]:
    """The batch's result, or its error naming the transaction to skip."""
    try:
        return fut.result()
    except SparkapplyError as exc:
        raise _locate(exc, batch) from exc.__cause__


def _locate(exc: SparkapplyError, batch: Batch) -> SparkapplyError:
    """Name the failing transaction (xid and commit LSN) when the error tells which one
    it is, and how to skip it when retrying cannot help."""
    txns = batch.txns
    xid = exc.context.get("xid")
    lsn = exc.context.get("lsn")
    found = next((t for t in txns if xid is not None and t.xid == xid), None)
    if found is None and lsn is not None:
        found = next((t for t in txns if int(t.commit_lsn) == int(lsn)), None)
    if found is None and len(txns) == 1:
        found = txns[0]
    if found is None:
        return exc
    exc.with_context(xid=found.xid, lsn=found.commit_lsn)
    exc.context["lsn"] = found.commit_lsn  # the commit LSN, which `skip` takes
    if exc.kind is not ErrorKind.TRANSIENT and not isinstance(exc, InternalError):
        skip = (
            f"to drop this one transaction instead: sparkapply skip --config <file> "
            f"--lsn {found.commit_lsn}"
        )
        exc.hint = f"{exc.hint}; {skip}" if exc.hint else skip
    return exc
