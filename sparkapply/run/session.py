"""One replication session: from the connection to the first status update, its parts
made and wired together, and what its apply thread runs.

A session starts from the slot's confirmed position with fresh caches (see the
subscriber's ERRORS): the slot is ensured, the tables not yet in Iceberg are copied,
staged files of transactions that never committed are swept, and the assembler, the
scheduler, the applier and maintenance are made anew before streaming starts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkapply import collector
from sparkapply.apply.tasks import internal_error
from sparkapply.changes.assembler import Assembler
from sparkapply.changes.cut_requests import CutRequests
from sparkapply.changes.prepared import PreparedStore
from sparkapply.changes.progress import Progress
from sparkapply.changes.skip import SkipStore
from sparkapply.config import Config
from sparkapply.convert.schema import relation_identifier
from sparkapply.copy.driver import TableCopier
from sparkapply.copy.snapshot import published_tables
from sparkapply.errors import SlotError, SparkapplyError
from sparkapply.lsn import Lsn
from sparkapply.maintain.background import BackgroundMaintenance
from sparkapply.maintain.maintainer import Maintainer
from sparkapply.plan.scheduler import Batch, BatchScheduler
from sparkapply.run.batch import Applier, BatchStats
from sparkapply.run.errors import spark_job_error
from sparkapply.run.sweep import sweep_staged
from sparkapply.sink.atomic import atomic_commits, commit_mode
from sparkapply.sink.cuts import CutLog, claim_cuts_table, cuts_identifier
from sparkapply.sink.progress import applied_lsn
from sparkapply.source.connection import ReplicationConnection, connect
from sparkapply.source.negotiation import Protocol, start_replication_command
from sparkapply.source.publisher import (
    PublishedTable,
    SlotInfo,
    enable_failover,
    ensure_slot,
    publisher_identity,
    slot_exists,
)
from sparkapply.source.stream import ReplicationStream
from sparkapply.source.wakeup import Wakeup
from sparkapply.staging.records import kept_by_staging
from sparkapply.staging.stager import Stager
from sparkapply.state.layout import prepared_dir

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Session:
    """The parts of one streaming session the subscriber's loop drives."""

    stream: ReplicationStream
    assembler: Assembler
    progress: Progress
    scheduler: BatchScheduler
    job: ApplyJob
    streaming_started: float  # time.monotonic() at START_REPLICATION


@dataclass(frozen=True, slots=True)
class SlotPolicy:
    """How a session treats its slot: ``reconnecting`` after a transient error (the
    slot may still be held by the dead session's walsender), and what to call when the
    slot is missing while the mirror holds copied tables."""

    reconnecting: bool = False
    on_missing: Callable[[], None] = lambda: None


def copy_first(
    cfg: Config,
    conn: ReplicationConnection,
    protocol: Protocol,
    spark: SparkSession,
    catalog: Catalog,
    check_interval: float,
    policy: SlotPolicy | None = None,
) -> tuple[SlotInfo, TableCopier]:
    """The slot to stream from, once what is not yet in Iceberg is copied (the
    exported snapshot lives until the next command on ``conn``; see
    :mod:`sparkapply.copy.driver`), and the copier that copies tables published later."""
    src = cfg.source
    policy = policy or SlotPolicy()
    if cfg.sink.cuts_table:  # before anything is copied into the catalog
        claim_cuts_table(catalog, cuts_identifier(cfg.sink.cuts_table), publisher_identity(conn))
    failover = src.failover_for(conn.server_version)
    if src.failover is True and conn.server_version < 170000:
        raise SlotError(
            f"[source] failover = true needs PostgreSQL 17+; {conn.where} is "
            f"{conn.server_version // 10000}",
            hint="set [source] failover = false (or 'auto'), or upgrade the publisher",
        )
    if not slot_exists(conn, src.slot):
        _slot_missing(cfg, catalog, policy)
    slot = ensure_slot(
        conn,
        src.slot,
        create=src.create_slot,
        two_phase=protocol.two_phase,
        snapshot="export",
        failover=failover,
        reconnecting=policy.reconnecting,
    )
    if slot.created:
        log.info(
            "created replication slot %s at %s%s",
            slot.name,
            slot.consistent_point,
            " (a failover slot)" if slot.failover else "",
        )
    elif failover and not slot.failover:
        slot = enable_failover(conn, slot)
    # Made before the copy: the initial copy records the first cut (copy/commit.py).
    cuts = _cut_log(cfg, catalog)
    copier = TableCopier(cfg, spark, catalog, check_interval=check_interval, cuts=cuts)
    return copier.before_streaming(conn, slot, two_phase=protocol.two_phase), copier


def _slot_missing(cfg: Config, catalog: Catalog, policy: SlotPolicy) -> None:
    """The slot is gone but the mirror holds tables copied through it: a failover to a
    standby the slot was not synced to, or a dropped slot. Never silent: stop, or
    warn (and count) before every table is copied again."""
    src = cfg.source
    with connect(src.dsn, connect_timeout=src.connect_timeout) as c:
        names = published_tables(c, src.publication)
    held = [
        ident
        for ident in (cfg.table_identifier(schema, name) for schema, name in names)
        if catalog.table_exists(ident) and applied_lsn(catalog.load_table(ident)) is not None
    ]
    if not held:
        return
    what = (
        f"replication slot {cfg.source.slot!r} is missing on the publisher, but the mirror "
        f"holds {len(held)} table(s) copied through it ({'.'.join(held[0])}, ...): a failover "
        "to a standby the slot was not synced to, or the slot was dropped"
    )
    if cfg.source.missing_slot == "stop":
        raise SlotError(
            what,
            hint="to copy every table again, set [source] missing_slot = 'copy' (or create "
            "the slot yourself); to avoid this after a failover, use a failover slot "
            "([source] failover, PostgreSQL 17+, with sync_replication_slots on the standby)",
        )
    policy.on_missing()
    log.warning("%s; creating it and copying every table again", what)


@contextmanager
def streaming(
    cfg: Config,
    conn: ReplicationConnection,
    slot: SlotInfo,
    protocol: Protocol,
    copier: TableCopier,
    published: Sequence[PublishedTable],
    spark: SparkSession,
    catalog: Catalog,
) -> Iterator[Session]:
    """Make the session's parts and start streaming from ``slot``'s confirmed position;
    the stager's tasks are closed when the session ends."""
    work = cfg.work_dir
    progress = Progress(slot.confirmed_flush)
    prepared = PreparedStore(prepared_dir(work))
    sweep_staged(work, catalog)
    stager = _stager(cfg, protocol, spark, catalog)
    wakeup = Wakeup()
    try:
        assembler = Assembler(
            work,
            proto_version=protocol.proto_version,
            streaming=protocol.streaming,
            prepared=prepared,
            progress=progress,
            stager=stager,
        )
        cuts = copier.cuts
        if cuts is not None:
            cuts.track(cfg.table_identifier(t.schema, t.name) for t in published)
            copier.cut_requests = CutRequests(work)  # the copies' cuts: the scheduler's
        applier = _applier(cfg, protocol, spark, catalog, cuts)
        scheduler = BatchScheduler(
            assembler,
            progress,
            cfg.apply,
            skips=SkipStore(work),
            prepared=prepared,
            cut_requests=copier.cut_requests,
        )
        stream = ReplicationStream(
            conn,
            status_interval=cfg.source.status_interval,
            wakeup=wakeup,
            receive_timeout=cfg.source.receive_timeout,
        )
        started = time.monotonic()
        stream.start(
            start_replication_command(
                slot.name, Lsn(0), cfg.source.publication, protocol, origin=cfg.source.origin
            ),
            slot.confirmed_flush,
        )
        maintenance = _maintenance(cfg, spark, catalog, applier, cuts)
        applier.multidimensional = copier.multidimensional
        job = ApplyJob(applier, copier, maintenance)
        with collector.settled():
            yield Session(stream, assembler, progress, scheduler, job, started)
    finally:
        stager.close()
        wakeup.close()
        copier.close()


def _stager(cfg: Config, protocol: Protocol, spark: SparkSession, catalog: Catalog) -> Stager:
    table_map = dict(cfg.sink.tables)
    return Stager(
        spark,
        catalog,
        lambda rel: relation_identifier(rel, table_map),
        work_dir=cfg.work_dir,
        stage_bytes=cfg.apply.stage_bytes,
        inflight_bytes=cfg.apply.stage_inflight_bytes,
        proto_version=protocol.proto_version,
        streaming=protocol.streaming,
    )


def _cut_log(cfg: Config, catalog: Catalog) -> CutLog | None:
    """The record of cuts (sink/cuts.py); it names the published tables once
    streaming starts (``CutLog.track``)."""
    sink = cfg.sink
    if not sink.cuts_table:
        return None
    to_source = {ice: pg for pg, ice in sink.tables.items()}
    return CutLog(
        catalog,
        cuts_identifier(sink.cuts_table),
        retain_seconds=cfg.maintenance.retain_seconds,
        source_names=lambda ident: to_source.get(".".join(ident), ".".join(ident)),
    )


def _applier(
    cfg: Config, protocol: Protocol, spark: SparkSession, catalog: Catalog, cuts: CutLog | None
) -> Applier:
    applier = Applier(
        spark,
        catalog,
        table_map=dict(cfg.sink.tables),
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
    return applier


def _maintenance(
    cfg: Config, spark: SparkSession, catalog: Catalog, applier: Applier, cuts: CutLog | None
) -> BackgroundMaintenance | None:
    """Maintenance beside the apply (maintain/background.py), when it is on; the
    applier's expiry then runs there too."""
    if not cfg.maintenance.enabled:
        return None
    maintenance = BackgroundMaintenance(
        Maintainer(
            cfg.maintenance,
            spark,
            catalog,
            locks=applier.locks,
            protected=cuts.protected if cuts is not None else None,
            waiting=lambda: kept_by_staging(cfg.work_dir),
        ),
        applier.known_tables,
        retain_snapshots=cfg.sink.retain_snapshots,
    )
    applier.expire_beside = maintenance.expire_later
    return maintenance


class ApplyJob:
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
        self._warming = True  # reading ahead while idle (``warm``) has not failed

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

    def wants_warming(self) -> bool:
        return self._warming and self.applier.wants_warming()

    def warm(self, stop: Callable[[], bool]) -> None:
        """Read ahead what the next batch reads (:meth:`Applier.warm`), until ``stop()``.
        It only saves a later read: a failure is logged, and reading ahead ends for
        the session."""
        try:
            self.applier.warm(stop)
        except Exception as exc:  # it only saves a later read: see the docstring
            log.warning(
                "reading table files ahead of need failed (%s); batches read them when "
                "they need them",
                exc,
            )
            self._warming = False

    def _forget_copied(self) -> None:
        for ident in self.copier.take_copied():
            self.applier.forget(ident)
