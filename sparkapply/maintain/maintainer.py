"""The maintenance policy: what runs when, per table, and the report of each run.

WHEN

:meth:`Maintainer.run_due` is for the run loop, between batches, on the apply thread
(never concurrently with an apply of the same table: see ``compact.py``). Per table it
reads the current snapshot's health (summary totals and manifest count, no data file
read) and runs only what a threshold calls for, in this order:

1. compaction, when the table has more than ``max_data_files`` data files, more than
   ``max_delete_files`` delete files, or more than ``max_delete_ratio`` of its rows
   deleted by position deletes (and at least ``RATIO_MIN_DELETED_ROWS``);
2. manifest merge, when the current snapshot has more than ``max_manifests`` manifests
   (a compaction merges them as it commits);
3. expiry with file deletion, when at least a tenth of ``retain_snapshots`` (at least
   one) snapshots are older than ``retain_seconds`` and beyond the newest
   ``retain_snapshots``;
4. the orphan sweep, at most every ``orphan_interval_seconds`` per table (the first
   call sweeps at once: that is what clears a crashed run's leftovers).

:meth:`Maintainer.run` is ``sparkapply maintain``: every step that has anything to do,
thresholds ignored (``dry_run`` commits and deletes nothing). A conflict with a
concurrent commit (transient) is logged and left for the next run.

AFTER A RUN

A report whose ``committed`` is true changed the table's current snapshot (same rows,
same applied LSN): a caller that caches the table object, as the apply does, must
drop it (``run_due(tables, on_commit=applier.forget)``) so the next batch plans
against the new files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from pyiceberg.exceptions import NoSuchTableError

from sparkapply.config import MaintenanceConfig
from sparkapply.errors import CommitConflictError, ErrorKind, SparkapplyError
from sparkapply.maintain.compact import CompactionOutcome, compact
from sparkapply.maintain.plan import Health, health
from sparkapply.sink.locks import TableLocks
from sparkapply.sink.maintenance import (
    ExpiryOutcome,
    OrphanOutcome,
    doomed_snapshots,
    expire_and_delete,
    sweep_orphans,
)
from sparkapply.sink.manifest_reads import READS
from sparkapply.sink.rewrite import commit_rewrite
from sparkapply.sink.tables import TableIdentifier

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

T = TypeVar("T")

SCHEDULER_POOL = "maintenance"

# Runs in a row whose commit found the table moved in a way a compaction cannot carry
# over (``rebase.py``: a TRUNCATE, another process's rewrite) before the next run holds
# the table throughout, so that the table's files do not only grow. Batches that only
# add files and deletes are carried over: they no longer make a run lose.
LOST_RACES_BEFORE_HOLDING = 2
# A table that needed holding stays held for this long after: beside a steady stream
# two unlocked runs in three lost their race (their work thrown away, on cores the
# apply needs) before the third held the table anyway.
HOT_SECONDS = 300.0

# The delete ratio calls for a compaction only once this many rows are deleted: a small
# hot table (pgbench's branches: one row, updated by every batch) is over any ratio
# after each batch, and rewriting it every second costs the apply CPU and lock waits
# for nothing a reader would notice. Its file counts still bound it.
RATIO_MIN_DELETED_ROWS = 10_000

# Held around one commit of a table (sink/locks.py); a no-op when run alone.
Guard = Callable[[], AbstractContextManager[None]]


@dataclass(frozen=True, slots=True)
class Due:
    """The maintenance steps a table's thresholds call for."""

    by_ratio: bool  # over the table-wide delete ratio
    compact: bool
    merge: bool
    expire: bool
    sweep: bool

    @property
    def anything(self) -> bool:
        return self.compact or self.merge or self.expire or self.sweep


@dataclass(slots=True)
class MaintenanceReport:
    """What one maintenance run did to one table."""

    table: str
    dry_run: bool
    before: Health
    after: Health | None = None
    compaction: CompactionOutcome | None = None
    manifests_merged: tuple[int, int] | None = None  # (before, after)
    expiry: ExpiryOutcome | None = None
    orphans: OrphanOutcome | None = None
    seconds: float = 0.0
    committed: bool = False  # a snapshot was committed: drop cached table objects
    errors: list[str] = field(default_factory=list)
    lost_race: bool = False  # a commit found the table moved by the apply

    def summary(self) -> str:
        after = self.after or self.before
        parts = [
            f"{self.table}: files {self.before.files}->{after.files} "
            f"({self.before.data_files}+{self.before.delete_files} -> "
            f"{after.data_files}+{after.delete_files} data+delete), "
            f"bytes {self.before.data_bytes}->{after.data_bytes}"
        ]
        if self.compaction is not None and self.compaction.data_files_rewritten + (
            self.compaction.delete_files_removed
        ):
            c = self.compaction
            parts.append(
                f"compaction {c.data_files_rewritten} data files -> {c.data_files_added}, "
                f"{c.delete_files_removed} delete files -> {c.delete_files_added}"
            )
        if self.manifests_merged is not None:
            parts.append(f"manifests {self.manifests_merged[0]}->{self.manifests_merged[1]}")
        if self.expiry is not None:
            e = self.expiry
            parts.append(
                f"{e.snapshots_expired} snapshots expired, {e.files_deleted} files + "
                f"{e.metadata_files_deleted} metadata files deleted ({e.bytes_deleted} bytes)"
            )
        if self.orphans is not None:
            parts.append(
                f"{self.orphans.files_deleted} orphans removed ({self.orphans.bytes_deleted} bytes)"
            )
        parts.extend(f"error: {e}" for e in self.errors)
        parts.append(f"{self.seconds:.2f}s")
        return ("dry run: " if self.dry_run else "") + "; ".join(parts)


class Maintainer:
    """Runs maintenance on tables of ``catalog``; see the module doc.

    ``spark`` is a session or a function returning one (called only when a compaction
    has work, so ``sparkapply maintain --dry-run`` starts no Spark). ``clock`` returns
    seconds since the epoch (tests move it).
    """

    def __init__(
        self,
        config: MaintenanceConfig,
        spark: SparkSession | Callable[[], SparkSession] | None,
        catalog: Catalog,
        *,
        clock: Callable[[], float] = time.time,
        locks: TableLocks | None = None,
        protected: Callable[[TableIdentifier], Collection[int]] | None = None,
        waiting: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.config = config
        # The snapshots kept cuts name, by table: expiry keeps them (sink/cuts.py).
        self.protected = protected or (lambda ident: ())
        # Files staged for prepared or streamed transactions, as name prefixes: the
        # orphan sweep keeps them, however long their commit takes to come
        # (staging/records.py, kept_by_staging).
        self.waiting = waiting or (lambda: ())
        # Beside the apply (its own thread): each commit holds the table's lock.
        self.locks = locks
        self.catalog = catalog
        self._spark = spark
        self.clock = clock
        self._last_sweep: dict[TableIdentifier, float] = {}
        self._tolerant = False  # between batches: a failed step is logged, not raised
        self._quiet: dict[TableIdentifier, Health] = {}  # health when a plan found nothing
        self._lost: dict[TableIdentifier, int] = {}  # runs in a row that lost a race
        self._hot_until: dict[TableIdentifier, float] = {}  # held runs until then

    def spark(self) -> SparkSession:
        if self._spark is None:
            raise SparkapplyError("compaction needs a Spark session", hint="pass one to Maintainer")
        if callable(self._spark):
            self._spark = self._spark()
        # Jobs of this thread go to their own pool: under the session's FAIR
        # scheduling, an apply's tasks do not queue behind a compaction's.
        self._spark.sparkContext.setLocalProperty("spark.scheduler.pool", SCHEDULER_POOL)
        return self._spark

    def run_due(
        self,
        tables: Iterable[TableIdentifier],
        *,
        on_commit: Callable[[TableIdentifier], None] | None = None,
    ) -> list[MaintenanceReport]:
        """Maintenance the thresholds call for, per table; reports of the tables where
        something ran (see the module doc). Call between batches, on the apply thread.

        ``on_commit(ident)`` is called for each table whose current snapshot changed
        (same rows, same applied LSN, other files): pass ``Applier.forget`` so that the
        next batch re-loads the table instead of planning against files that are gone.
        """
        reports = []
        for ident in tables:
            try:
                report = self._run(ident, dry_run=False, due_only=True)
            except NoSuchTableError:
                continue  # not created yet: its first batch creates it
            if report is not None:
                reports.append(report)
                if report.committed and on_commit is not None:
                    on_commit(ident)
        return reports

    def run(self, ident: TableIdentifier, *, dry_run: bool = False) -> MaintenanceReport:
        """Every maintenance step of ``ident`` that has anything to do."""
        report = self._run(ident, dry_run=dry_run, due_only=False)
        assert report is not None
        return report

    def _run(
        self, ident: TableIdentifier, *, dry_run: bool, due_only: bool
    ) -> MaintenanceReport | None:
        started = time.monotonic()
        table = self.catalog.load_table(ident)
        before = health(table)
        now = self.clock()
        due = self._due(ident, table, before, now, every=not due_only)
        if not due.anything:
            return None
        report = MaintenanceReport(".".join(ident), dry_run, before)
        self._tolerant = due_only
        guard = self._guard(ident)
        if self.holds(ident, now):
            # Its last runs lost their race: this run holds the table from its plan
            # to its last commit (the apply of that table waits for it).
            with guard():
                table = self.catalog.load_table(ident)
                self._steps(report, ident, table, now, due, dry_run, contextlib.nullcontext)
            if not report.lost_race:
                self._hot_until[ident] = now + HOT_SECONDS
        else:
            self._steps(report, ident, table, now, due, dry_run, guard)
        self._lost[ident] = self._lost.get(ident, 0) + 1 if report.lost_race else 0
        report.after = before if dry_run else health(self.catalog.load_table(ident))
        report.seconds = time.monotonic() - started
        logger.info("maintenance %s", report.summary())
        return report

    def holds(self, ident: TableIdentifier, now: float) -> bool:
        """Whether a run of ``ident`` now holds the table throughout: after
        :data:`LOST_RACES_BEFORE_HOLDING` lost races, and for :data:`HOT_SECONDS`
        after a held run."""
        return self._lost.get(ident, 0) >= LOST_RACES_BEFORE_HOLDING or now < self._hot_until.get(
            ident, 0.0
        )

    def _due(
        self, ident: TableIdentifier, table: Table, before: Health, now: float, *, every: bool
    ) -> Due:
        """Which steps the thresholds call for (``every``: all of them, on demand)."""
        cfg = self.config
        # (Unless the last plan found nothing: then the file counts decide; see below.)
        by_ratio = (
            before.delete_ratio > cfg.max_delete_ratio
            and before.position_deletes >= RATIO_MIN_DELETED_ROWS
            and ident not in self._quiet
        )
        since_sweep = now - self._last_sweep.get(ident, float("-inf"))
        return Due(
            by_ratio=by_ratio,
            compact=every or by_ratio or self._too_many_files(ident, before),
            merge=every or before.manifests > cfg.max_manifests,
            expire=every or len(self._doomed(table, now)) >= max(1, cfg.retain_snapshots // 10),
            sweep=every or since_sweep >= cfg.orphan_interval_seconds,
        )

    def _steps(
        self,
        report: MaintenanceReport,
        ident: TableIdentifier,
        table: Table,
        now: float,
        due: Due,
        dry_run: bool,
        guard: Guard,
    ) -> None:
        cfg = self.config
        before = report.before
        if due.compact:
            # Over the table-wide ratio, files at that ratio are worth a rewrite too.
            ratio = min(cfg.file_delete_ratio, cfg.max_delete_ratio) if due.by_ratio else None
            report.compaction = self._step(
                report, lambda: self._compact(table, dry_run, ratio, guard)
            )
            if report.compaction is not None and report.compaction.snapshot_id is not None:
                report.committed = True
                self._quiet.pop(ident, None)
            elif report.compaction is not None and not dry_run:
                self._quiet[ident] = before  # nothing worth rewriting: see _too_many_files
        if not report.committed and due.merge:
            merged = self._step(report, lambda: self._merge_manifests(table, dry_run, guard))
            if merged is not None and merged[0] != merged[1]:
                report.manifests_merged = merged
                report.committed = report.committed or not dry_run
        if due.expire:
            report.expiry = self._step(report, lambda: self._expire(table, now, dry_run, guard))
        if due.sweep:
            report.orphans = self._step(
                report,
                lambda: sweep_orphans(
                    table,
                    older_than=dt.datetime.fromtimestamp(now - cfg.orphan_grace_seconds, tz=dt.UTC),
                    dry_run=dry_run,
                    waiting=self.waiting(),
                ),
            )
            if not dry_run:
                self._last_sweep[ident] = now

    def _too_many_files(self, ident: TableIdentifier, h: Health) -> bool:
        """Over a file-count threshold, and, if the last plan found nothing worth
        rewriting (a big table has many files near the target size), a quarter of the
        threshold more files than then: the plan reads every delete file, it must not
        run after every batch for nothing."""
        cfg = self.config
        quiet = self._quiet.get(ident)
        data_floor = cfg.max_data_files
        delete_floor = cfg.max_delete_files
        if quiet is not None:
            data_floor = max(data_floor, quiet.data_files + max(1, cfg.max_data_files // 4))
            delete_floor = max(delete_floor, quiet.delete_files + max(1, cfg.max_delete_files // 4))
        return h.data_files > data_floor or h.delete_files > delete_floor

    def _cutoff(self, now: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(now - self.config.retain_seconds, tz=dt.UTC)

    def _doomed(self, table: Table, now: float) -> list[int]:
        return doomed_snapshots(
            table.metadata,
            older_than=self._cutoff(now),
            retain_last=self.config.retain_snapshots,
            keep=self.protected(_ident(table)),
        )

    def _guard(self, ident: TableIdentifier) -> Guard:
        if self.locks is None:
            return contextlib.nullcontext
        locks = self.locks
        return lambda: locks.committing(ident)

    def _compact(
        self, table: Table, dry_run: bool, ratio: float | None, guard: Guard
    ) -> CompactionOutcome:
        return compact(
            table,
            self.spark,
            target_file_size=self.config.target_file_size,
            file_delete_ratio=self.config.file_delete_ratio if ratio is None else ratio,
            driver_compact_bytes=self.config.driver_compact_bytes,
            dry_run=dry_run,
            guard=guard,
        )

    def _expire(self, table: Table, now: float, dry_run: bool, guard: Guard) -> ExpiryOutcome:
        return expire_and_delete(
            table,
            older_than=self._cutoff(now),
            retain_last=self.config.retain_snapshots,
            dry_run=dry_run,
            keep=self.protected(_ident(table)),
            guard=guard,
        )

    def expire_excess(self, ident: TableIdentifier, *, retain_last: int) -> None:
        """The apply's own expiry ([sink] retain_snapshots: keep commits cheap), run here
        beside the apply: reading manifests and deleting files took about a second a
        table, on the apply thread, before the batch was acknowledged."""
        try:
            table = self.catalog.load_table(ident)
            expire_and_delete(
                table,
                older_than=dt.datetime.now(dt.UTC),
                retain_last=retain_last,
                keep=self.protected(ident),
                guard=self._guard(ident),
            )
        except SparkapplyError as exc:  # retried once the apply asks again
            logger.warning("%s", exc)

    def _merge_manifests(self, table: Table, dry_run: bool, guard: Guard) -> tuple[int, int]:
        """Rewrite the current snapshot's manifests as one data and one delete manifest
        (a ``replace`` snapshot with the same files)."""
        snapshot = table.current_snapshot()
        if snapshot is None:
            return (0, 0)
        manifests = READS.manifests(snapshot, table.io)
        contents = {m.content for m in manifests}
        if len(manifests) <= len(contents):
            return (len(manifests), len(manifests))
        if dry_run:
            return (len(manifests), len(contents))
        with guard():
            # On the snapshot current now: a merge keeps every file, so whatever the
            # apply committed since the look above is merged too.
            table.refresh()
            head = table.current_snapshot()
            assert head is not None
            manifests = READS.manifests(head, table.io)  # the commit reads the same list
            commit_rewrite(table, base_snapshot_id=head.snapshot_id)
        after = table.current_snapshot()
        assert after is not None
        return (len(manifests), len(READS.manifests(after, table.io)))

    def _step(self, report: MaintenanceReport, step: Callable[[], T]) -> T | None:
        """Run one step; a transient failure (a concurrent commit) is left for the
        next run. Between batches every sparkapply error is (a failed maintenance step
        leaves the table as it was, and must not stop replication); on demand, the
        others propagate."""
        try:
            return step()
        except SparkapplyError as exc:
            if exc.kind is not ErrorKind.TRANSIENT and not self._tolerant:
                raise
            report.lost_race = report.lost_race or isinstance(exc, CommitConflictError)
            log = logger.warning if exc.kind is ErrorKind.TRANSIENT else logger.error
            log("maintenance of %s: %s (retried at the next run)", report.table, exc)
            report.errors.append(str(exc).splitlines()[0])
            return None


def _ident(table: Table) -> TableIdentifier:
    namespace, name = table.name()[-2:]
    return namespace, name
