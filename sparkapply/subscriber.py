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

STOPPING
    ``stop()`` (SIGTERM, Ctrl-C) lets the running batch finish (its acknowledgement is
    sent) and abandons the rest: it is only in the spool, and the server sends it again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from sparkapply.apply.batch import Applier, BatchStats
from sparkapply.changes.assembler import Assembler
from sparkapply.changes.prepared import PreparedStore
from sparkapply.changes.progress import Progress
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.config import Config
from sparkapply.copy.driver import PUBLICATION_CHECK_INTERVAL, TableCopier
from sparkapply.errors import ConnectionLostError, SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.lsn import INVALID_LSN, Lsn
from sparkapply.source.connection import ReplicationConnection
from sparkapply.source.negotiation import Protocol, start_replication_command
from sparkapply.source.publisher import check_publisher, ensure_slot
from sparkapply.source.stream import ReplicationStream

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
    reconnects: int = 0  # connections lost and opened again


class Subscriber:
    # Seconds between looks at the publication's tables (new ones are copied).
    publication_check_interval: float = PUBLICATION_CHECK_INTERVAL

    def __init__(
        self,
        config: Config,
        *,
        spark: SparkSession | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self.config = config
        self._spark = spark
        self._catalog = catalog
        self._stop = threading.Event()
        self.summary = RunSummary()
        self._copier: TableCopier | None = None

    def stop(self) -> None:
        self._stop.set()

    # -- setup ------------------------------------------------------------------------

    def _open_sinks(self) -> tuple[SparkSession, Catalog]:
        if self._catalog is None:
            from sparkapply.sink.catalog import open_catalog

            self._catalog = open_catalog(
                self.config.sink.catalog_name, self.config.catalog_properties()
            )
        if self._spark is None:
            from sparkapply.apply.session import get_session

            self._spark = get_session(
                self.config.spark.master, self.config.spark.app_name, self.config.spark.conf
            )
        return self._spark, self._catalog

    def _target_lsn(self) -> Lsn:
        # The insert position, not pg_current_wal_lsn(): with synchronous_commit off a
        # committed transaction's record may not be written yet.
        with psycopg.connect(self.config.source.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(row[0])

    # -- the loop ---------------------------------------------------------------------

    def run(self, *, until_caught_up: bool = False) -> RunSummary:
        """Replicate until :meth:`stop` (or, with ``until_caught_up``, until everything
        committed before the call is applied and acknowledged)."""
        src = self.config.source
        protocol, _tables = check_publisher(src.dsn, src.publication)
        spark, catalog = self._open_sinks()
        target = self._target_lsn() if until_caught_up else None
        backoff = 1.0
        while not self._stop.is_set():
            try:
                done = self._session(protocol, spark, catalog, target)
                if done:
                    break
            except ConnectionLostError as exc:
                log.warning("replication connection lost: %s; retrying in %.0fs", exc, backoff)
                self.summary.reconnects += 1
                if self._stop.wait(backoff):
                    break
                backoff = min(backoff * 2, src.reconnect_max_backoff)
        return self.summary

    def _session(
        self, protocol: Protocol, spark: SparkSession, catalog: Catalog, target: Lsn | None
    ) -> bool:
        cfg = self.config
        src = cfg.source
        work = cfg.work_dir
        work.mkdir(parents=True, exist_ok=True)
        conn = ReplicationConnection(src.dsn, connect_timeout=src.connect_timeout)
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
            prepared = PreparedStore(work / "prepared")
            assembler = Assembler(
                work,
                proto_version=protocol.proto_version,
                streaming=protocol.streaming,
                prepared=prepared,
                progress=progress,
            )
            applier = Applier(
                spark,
                catalog,
                table_map=dict(cfg.sink.tables),
                proto_version=protocol.proto_version,
                streaming=protocol.streaming,
                retain_snapshots=cfg.sink.retain_snapshots,
            )
            applier.before_apply = copier.before_batch  # copies tables seen for the first time
            copier.on_copied = applier.forget
            stream = ReplicationStream(conn, status_interval=src.status_interval)
            stream.start(
                start_replication_command(
                    slot.name, Lsn(0), src.publication, protocol, origin=src.origin
                ),
                slot.confirmed_flush,
            )
            return self._loop(stream, assembler, applier, progress, target)
        finally:
            conn.close()

    def _loop(
        self,
        stream: ReplicationStream,
        assembler: Assembler,
        applier: Applier,
        progress: Progress,
        target: Lsn | None,
    ) -> bool:
        cfg = self.config.apply
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkapply-apply")
        running: tuple[Future[BatchStats], list[tuple[CommittedTxn, list[int]]]] | None = None
        copying: Future[None] | None = None  # the periodic check for newly published tables
        ready_since: float | None = None  # when the oldest waiting transaction committed
        last_ping = 0.0
        try:
            while True:
                frames = stream.poll_burst(0.05 if running or assembler.ready else 0.2)
                feed = assembler.feed
                for wal_start, payload in frames:
                    feed(payload, wal_start)
                if assembler.ready and ready_since is None:
                    ready_since = time.monotonic()

                if running is not None and running[0].done():
                    fut, batch = running
                    running = None
                    stats = fut.result()  # re-raises the apply's error: nothing acknowledged
                    failpoint("before-ack")
                    for txn, _ in batch:
                        assembler.release(txn)
                    progress.mark_done([item for _, item in batch])
                    self.summary.batches += 1
                    self.summary.transactions += len(batch)
                    self.summary.changes += stats.changes
                    log.info(
                        "applied %d transactions (%d changes) to %d tables; flushed to %s",
                        len(batch),
                        stats.changes,
                        stats.tables,
                        progress.flushed,
                    )

                if copying is not None and copying.done():
                    copying.result()  # re-raises the copy's error
                    copying = None
                elif (
                    running is None
                    and not self._stop.is_set()
                    and self._copier is not None
                    and self._copier.due()
                ):
                    # Same single-threaded pool: batches queue behind the copy.
                    copying = pool.submit(self._copier.refresh)

                if self._stop.is_set() and running is None:
                    stream.set_flush_lsn(progress.flushed)
                    stream.send_status()
                    return True

                if running is None and assembler.ready and not self._stop.is_set():
                    # A batch closes when the stream pauses, when it is full, or when
                    # its oldest transaction has waited batch_linger: while a backlog
                    # drains, applying one batch overlaps receiving the next.
                    assert ready_since is not None
                    waited = time.monotonic() - ready_since >= cfg.batch_linger
                    full = (
                        assembler.ready_bytes >= cfg.batch_max_bytes
                        or len(assembler.ready) >= cfg.batch_max_transactions
                    )
                    if waited or full or not frames:
                        batch = assembler.take_ready(
                            cfg.batch_max_bytes, cfg.batch_max_transactions
                        )
                        ready_since = time.monotonic() if assembler.ready else None
                        running = (pool.submit(applier.apply, [t for t, _ in batch]), batch)

                idle = (
                    running is None
                    and not assembler.ready
                    and not assembler.in_transaction
                    and progress.pending == 0
                )
                if idle:
                    progress.follow(stream.last_received)
                stream.set_flush_lsn(progress.flushed)
                self.summary.flushed = progress.flushed

                if target is not None and idle:
                    if progress.flushed >= target:
                        stream.send_status()
                        return True
                    if time.monotonic() - last_ping > 1.0:
                        stream.send_status(reply_requested=True)
                        last_ping = time.monotonic()
        except SparkapplyError:
            raise
        finally:
            if running is not None:
                running[0].cancel()
                with contextlib.suppress(Exception):
                    running[0].result()
            pool.shutdown(wait=True)
