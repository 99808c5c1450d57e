"""The driver's side of one batch: load its tables, run its Spark job, commit.

ORDERING
    The batch's transactions are in source commit order. Per table they form a chain
    (planned by :mod:`sparkapply.plan.batch`); one Spark task folds a table's chain and
    writes its files (new row versions as data files, replaced rows as position deletes:
    merge-on-read; :mod:`sparkapply.apply.job`); the driver stages one snapshot per
    table stamped with the commit LSN of the last transaction it contains, and the
    batch's cut (sink/cuts.py), and commits them in one catalog transaction where the
    catalog can (sink/atomic.py), else one table after another and the cut last.

FAILURE AND RESTART
    Nothing is acknowledged until every table of the batch has committed. Committing
    table by table, a crash between two tables' commits leaves them at different
    applied LSNs; on restart the
    server re-sends from the slot's confirmed position and each table skips the
    transactions at or below its own applied LSN, so nothing is applied twice.
    A failed task or commit removes the files the batch wrote (orphans) and raises.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from sparkapply import collector
from sparkapply.apply.fold.rowwise import TxnInput
from sparkapply.apply.job import run_tasks
from sparkapply.apply.tasks import TableResult, TableTask
from sparkapply.apply.write.locate import warm as warm_files
from sparkapply.changes.staged import PieceFiles
from sparkapply.changes.transaction import CommittedTxn, relations_named
from sparkapply.convert.schema import arrays_not_held_as_lists, relation_identifier
from sparkapply.convert.types import columns_as_text
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo, arrow_schema_of, data_directory
from sparkapply.errors import SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.frames import PG_EPOCH_OFFSET_MICROS
from sparkapply.plan.batch import (
    TableIdent,
    TablePlan,
    full_identity,
    identity_epochs,
    plan_batch,
    relation_versions,
)
from sparkapply.run.shares import BatchShares, StagedShare
from sparkapply.sink import contract
from sparkapply.sink.cuts import CutLog
from sparkapply.sink.locks import TableLocks
from sparkapply.sink.maintenance import doomed_snapshots
from sparkapply.storage import Storage

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BatchStats:
    """What one batch applied, and where its wall time went. Benchmarks and operators
    read it (``Subscriber(on_batch=...)``) instead of wrapping functions."""

    transactions: int = 0
    skipped: int = 0  # transactions at or below their table's applied LSN
    staged_rows: int = 0  # rows committed from files staged while their transaction arrived
    results: list[TableResult] = field(default_factory=list)  # one per table committed
    # Planning (tables loaded, live files listed, tasks built; with staging, also the
    # wait for its pieces), the Spark job, the Iceberg commits (all tables).
    plan_seconds: float = 0.0
    job_seconds: float = 0.0
    commit_seconds: float = 0.0
    started: float = 0.0  # time.monotonic() when apply() began and returned
    finished: float = 0.0

    @property
    def tables(self) -> int:
        return len(self.results)

    @property
    def changes(self) -> int:
        return sum(r.n_changes for r in self.results)

    @property
    def rows_written(self) -> int:
        return sum(r.rows_written for r in self.results)

    @property
    def rows_removed(self) -> int:
        return sum(r.rows_removed for r in self.results)


def _merged(a: BatchStats, b: BatchStats) -> BatchStats:
    return BatchStats(
        transactions=a.transactions + b.transactions,
        skipped=a.skipped + b.skipped,
        staged_rows=a.staged_rows + b.staged_rows,
        results=[*a.results, *b.results],
        plan_seconds=a.plan_seconds + b.plan_seconds,
        job_seconds=a.job_seconds + b.job_seconds,
        commit_seconds=a.commit_seconds + b.commit_seconds,
        started=a.started,
        finished=b.finished,
    )


class Applier:
    def __init__(
        self,
        spark: SparkSession,
        catalog: Catalog,
        *,
        table_map: dict[str, str] | None = None,
        proto_version: int = 4,
        streaming: str = "parallel",
        retain_snapshots: int = 100,
        split_bytes: int = 16 * 1024 * 1024,
        max_tasks_per_table: int = 0,
        driver_fold_bytes: int = 0,
        free_expired_files: bool = False,
        locks: TableLocks | None = None,
        atomic: bool = False,
        cuts: CutLog | None = None,
    ) -> None:
        self.spark = spark
        self.locks = locks or TableLocks()
        self.catalog = catalog
        self.table_map = table_map or {}
        self.proto_version = proto_version
        self.streaming = streaming
        # Every call to table storage goes through the sink's contract (sink/contract.py).
        self.sink: contract.Sink = contract.IcebergSink(catalog, atomic=atomic, cuts=cuts)
        self._states: dict[TableIdent, contract.TableState] = {}
        self._applied: dict[tuple[str, str], Lsn] = {}
        self._known: set[TableIdent] = set()
        self._columnless: set[str] = set()  # tables warned of (see _columnless_table)
        # Tables a batch located rows in, by their key columns, and the snapshot whose
        # files were last read ahead for each (``warm``).
        self._locating: dict[TableIdent, tuple[str, ...]] = {}
        self._warmed: dict[TableIdent, int | None] = {}
        self.retain_snapshots = retain_snapshots
        self.split_bytes = split_bytes
        # With maintenance on, expiry here also deletes the files only expired
        # snapshots referenced (otherwise they wait for the orphan sweep's grace).
        self.free_expired_files = free_expired_files
        self.max_tasks_per_table = max_tasks_per_table
        self.driver_fold_bytes = driver_fold_bytes
        self.atomic = atomic  # one catalog transaction per batch (sink/atomic.py)
        self.cuts = cuts  # each batch records a cut (sink/cuts.py)
        # Where the expiry below runs instead of on this thread (maintenance beside the
        # apply: maintain/background.py); None expires here, after the commit.
        self.expire_beside: Callable[[TableIdent], None] | None = None
        # Which of a relation's columns the publisher declares with more than one
        # dimension (the copier asks its catalog); None: none are.
        self.multidimensional: Callable[[int, Sequence[str]], set[str]] | None = None

    def identifier(self, rel: m.Relation) -> tuple[str, str]:
        return relation_identifier(rel, self.table_map)

    def applied(self, ident: tuple[str, str]) -> Lsn:
        return self._applied.get(ident, Lsn(0))

    def known_tables(self) -> list[TableIdent]:
        """Every table this applier has written to or loaded (for maintenance)."""
        return sorted(self._known)

    @property
    def cuts_ident(self) -> TableIdent:
        assert self.cuts is not None
        namespace, name = self.cuts.identifier[-2:]
        return (namespace, name)

    def forget(self, ident: TableIdent) -> None:
        """Drop what is cached of a table another writer (the copy) committed to."""
        self._states.pop(ident, None)
        self._applied.pop(ident, None)
        if self.cuts is not None:
            self.cuts.changed(ident)

    def wants_warming(self) -> bool:
        """A table a batch located rows in has files no read ahead has seen."""
        return any(self._warm_due(ident) for ident in self._locating)

    def warm(self, stop: Callable[[], bool]) -> None:
        """Read ahead into this process's file cache, table by table, what the next
        batch's locate reads (``apply/write/locate.py``, ``warm``), until ``stop()``.
        For the apply thread while the subscriber is idle: the next small batch is
        folded here (``apply/job.py``, SMALL BATCHES) and finds the files held. A file
        that cannot be read (expired since) ends the table's read ahead; the batch
        that needs the table reads what it needs."""
        for ident, key_names in list(self._locating.items()):
            state = self._states.get(ident)
            if state is None or not self._warm_due(ident):
                continue
            column = key_names[0] if len(key_names) == 1 else None
            data_files, delete_files = self.sink.live_files(state, column)
            try:
                if not warm_files(key_names, data_files, delete_files, stop):
                    return
            except OSError as exc:
                log.debug("reading ahead %s.%s stopped: %s", *ident, exc)
            self._warmed[ident] = state.snapshot_id

    def _warm_due(self, ident: TableIdent) -> bool:
        state = self._states.get(ident)
        if state is None:
            return False
        return ident not in self._warmed or self._warmed[ident] != state.snapshot_id

    def apply(self, batch: Sequence[CommittedTxn]) -> BatchStats:
        """Apply ``batch``; where a table's replica identity changes within it, the
        parts before and after the change are applied one after another (see
        :func:`identity_epochs`), each committed, and acknowledged together."""
        with collector.paused():
            parts = identity_epochs(batch)
            stats = self._apply(parts[0])
            for part in parts[1:]:
                stats = _merged(stats, self._apply(part))
            return stats

    def _apply(self, batch: Sequence[CommittedTxn]) -> BatchStats:
        """One part of a batch, holding its tables from planning to commit, so that
        maintenance beside the apply never commits in between (sink/locks.py)."""
        idents = {self.identifier(rel) for rel in relations_named(batch)}
        if self.cuts is not None:  # the batch appends its cut; expiry beside may commit
            idents.add(self.cuts_ident)
        with self.locks.hold(idents) as changed:
            for ident in changed:  # maintenance committed: plan against the new files
                self.forget(ident)
            return self._apply_held(batch)

    def _apply_held(self, batch: Sequence[CommittedTxn]) -> BatchStats:
        stats = BatchStats(transactions=len(batch), started=time.monotonic())
        versions = relation_versions(batch, self.identifier)
        # Every table the batch names exists at its newest version, also one whose
        # transactions are all applied already (the LSN it holds is read from it).
        loaded = {ident: self._table(ident, rels) for ident, rels in versions.by_table.items()}
        plan = plan_batch(batch, versions, self.applied)
        stats.skipped = plan.skipped
        tasks: list[TableTask] = []
        planned: dict[str, contract.TableState] = {}
        shares: dict[str, StagedShare] = {}  # tables that use staged files
        direct: list[TableResult] = []  # tables whose changes were all staged
        used: set[str] = set()
        batch_shares = BatchShares(batch)
        for tp in plan.tables:
            state = planned[tp.name] = loaded[tp.ident]
            if self._columnless_table(tp.name, state):
                continue
            staged = StagedShare(tp.name)
            txns = self._inputs(tp, state, batch_shares, staged)
            if staged.files or staged.keyed:
                used.update(staged.files)
                shares[tp.name] = staged
                if not staged.keyed and not any(t.segments for t in txns):
                    direct.append(staged.result(max(t.commit_lsn for t in txns)))
                    continue  # all of it staged: no task
            tasks.append(self._task(tp, state, txns, staged.keyed))
        job_started = time.monotonic()
        stats.plan_seconds = job_started - stats.started
        results = self._run(tasks)
        unstaged = {r.table for r in results if r.unstaged}
        if unstaged:  # staged pieces that do not compose: from the spool, as unstaged
            log.info("applying %s from the spool: its staged pieces do not compose", unstaged)
            for r in results:
                if r.unstaged:  # what its other key partitions wrote
                    self.sink.remove_files(
                        planned[r.table].table, [*r.added, *(d.path for d in r.deletes)]
                    )
            for name in unstaged:
                used.difference_update(shares.pop(name).files)
            again = [tp for tp in plan.tables if tp.name in unstaged]
            results = [r for r in results if not r.unstaged] + self._run(
                [
                    self._task(
                        tp, planned[tp.name], self._inputs(tp, planned[tp.name], batch_shares)
                    )
                    for tp in again
                ]
            )
        stats.job_seconds = time.monotonic() - job_started
        for r in results:
            share = shares.get(r.table)
            if share is not None and r.error is None:
                share.add_to(r)
        results += direct
        failed = [r for r in results if r.error is not None]
        if failed:
            for r in results:
                self.sink.remove_files(
                    planned[r.table].table, [*r.added, *(d.path for d in r.deletes)]
                )
            err = failed[0].error
            assert err is not None
            raise err
        if any(r.deletes for r in results):
            failpoint("deletes-written")
        failpoint("before-commit")
        commit_started = time.monotonic()
        self._commit(results, planned, batch[-1])
        for r in results:
            state = planned[r.table]
            self._expire(state.table)
            self._applied[state.ident] = Lsn(r.last_commit_lsn)
            # The commit left the table object at the new snapshot: the next batch
            # plans against it without reading the catalog (a load per table per
            # batch was most of a small batch's planning). Another writer's commit
            # makes the apply forget it (``_apply``, ``forget``).
            self._states[state.ident] = dataclasses.replace(
                state,
                applied=Lsn(r.last_commit_lsn),
                snapshot_id=state.table.metadata.current_snapshot_id,
            )
            if r.table in shares:
                stats.staged_rows += shares[r.table].rows
        stats.commit_seconds = time.monotonic() - commit_started
        stats.results = results
        for txn in batch:
            if txn.staged is not None:
                txn.staged.finish(used)
        stats.finished = time.monotonic()
        return stats

    def _columnless_table(self, name: str, state: contract.TableState) -> bool:
        """A table without a column (``CREATE TABLE t ()``, or a column list that
        publishes none) has rows in PostgreSQL but none Iceberg can hold: a row is its
        values. Its changes are left out, as the initial copy leaves its rows out, with
        a warning once per run; when it gains a column, the changes from then on apply."""
        if state.table.schema().fields:
            return False
        if name not in self._columnless:
            self._columnless.add(name)
            log.warning(
                "table %s publishes no columns; its rows are not mirrored (Iceberg holds "
                "no row without a value)",
                name,
            )
        return True

    def _inputs(
        self,
        tp: TablePlan,
        state: contract.TableState,
        shares: BatchShares,
        staged: StagedShare | None = None,
    ) -> tuple[TxnInput, ...]:
        """The table's transactions as its task reads them: with ``staged``, less what
        the pieces staged while they arrived, when the table may use them (the batch
        only appends to it; or its one transaction in the batch, keyed, updates it)."""
        share = staged or StagedShare(tp.name)
        keyed = not tp.insert_only and tp.identity == "key" and len(tp.ordinals) == 1
        usable = staged is not None and (tp.insert_only or keyed)
        schema_id = state.table.schema().schema_id if usable else None
        return shares.inputs(tp.ordinals, tp.relation_ids, share, schema_id, keyed=keyed)

    def _run(self, tasks: list[TableTask]) -> list[TableResult]:
        return run_tasks(
            self.spark,
            tasks,
            split_bytes=self.split_bytes,
            max_tasks_per_table=self.max_tasks_per_table,
            driver_fold_bytes=self.driver_fold_bytes,
        )

    def _task(
        self,
        tp: TablePlan,
        state: contract.TableState,
        txns: tuple[TxnInput, ...],
        staged: tuple[PieceFiles, ...] = (),
    ) -> TableTask:
        table = state.table
        data_files: list[DataFileInfo] = []
        delete_files: list[DeleteFileInfo] = []
        if not tp.insert_only:  # the task locates rows: it needs the live files
            if tp.identity == "key" and tp.key_names:
                self._locating[state.ident] = tp.key_names
            key_column = tp.key_names[0] if len(tp.key_names) == 1 else None
            data_files, delete_files = self.sink.live_files(state, key_column)
        return TableTask(
            table=tp.name,
            relation_ids=tp.relation_ids,
            key_names=tp.key_names,
            identity=tp.identity,
            txns=txns,
            schema=arrow_schema_of(table),
            data_files=tuple(data_files),
            delete_files=tuple(delete_files),
            data_dir=data_directory(table),
            proto_version=self.proto_version,
            streaming=self.streaming,
            insert_only=tp.insert_only,
            staged=staged,
            storage=Storage.of(table.io.properties),
        )

    def _commit(
        self,
        results: list[TableResult],
        planned: dict[str, contract.TableState],
        last: CommittedTxn,
    ) -> None:
        """Every table's snapshot of the batch, and its cut (the sink's
        ``commit_batch``: one catalog transaction when the catalog can, otherwise one
        table after another and the cut last; a failure removes the files of the
        tables not committed)."""
        changes = [
            contract.TableChange(
                planned[r.table],
                Lsn(r.last_commit_lsn),
                added=r.added,
                deletes=r.deletes,
                truncate=r.truncated,
            )
            for r in results
        ]
        committed_at = dt.datetime.fromtimestamp(
            (last.commit_time + PG_EPOCH_OFFSET_MICROS) / 1e6, dt.UTC
        )
        self.sink.commit_batch(changes, cut=contract.CutPoint(Lsn(last.commit_lsn), committed_at))
        if self.cuts is not None and changes:
            # Beside, as for the mirrored tables: an expiry deletes files and took half a
            # second on the apply thread every ~50 batches. The apply holds the cuts
            # table's lock from planning to commit (``_apply``).
            self._expire(self.cuts.table)

    def record_requested_cut(self, lsn: Lsn) -> None:
        """A cut at exactly ``lsn``, asked for by ``sparkapply cut --at-lsn``: every
        transaction at or below it is applied and none above (the scheduler knows).
        Not made if a table already holds a later transaction (after a restart that
        replays what was applied but not acknowledged): no exact cut exists then."""
        cuts = self.cuts
        if cuts is None:
            return
        past = cuts.applied_past(lsn)
        if past:
            log.warning(
                "cannot cut at %s as asked: %s already hold transactions after it; the "
                "request is dropped (`sparkapply cut --lsn %s` gives the newest cut before)",
                lsn,
                ", ".join(past),
                lsn,
            )
            return
        with self.locks.hold({self.cuts_ident}):
            self.sink.commit_batch([], cut=contract.CutPoint(lsn, None, requested=True))
        log.info("recorded the cut at %s as asked", lsn)

    def _expire(self, table: Table, *, beside: bool = True) -> None:
        """Keep commits cheap: a commit's cost grows with the snapshots a table keeps.
        Snapshots a kept cut names stay (sink/cuts.py); expiry runs once half of
        ``retain_snapshots`` can go, not after every batch."""
        keep = self.retain_snapshots
        if keep <= 0 or len(table.metadata.snapshots) <= keep + keep // 2:
            return
        namespace, name = table.name()[-2:]
        protected = self.cuts.protected((namespace, name)) if self.cuts is not None else set()
        now = dt.datetime.now(dt.UTC)
        doomed = doomed_snapshots(table.metadata, older_than=now, retain_last=keep, keep=protected)
        if len(doomed) < max(1, keep // 2):
            return
        if beside and self.expire_beside is not None:
            self.expire_beside((namespace, name))
            return
        retention = contract.Retention(now, keep, protected, free_files=self.free_expired_files)
        try:
            self.sink.expire(table, retention)
        except SparkapplyError as exc:  # maintenance: try again after a later batch
            log.warning("%s", exc)

    def _table(self, ident: TableIdent, rels: list[tuple[m.Relation, Lsn]]) -> contract.TableState:
        self._known.add(ident)
        state = self._states.get(ident)
        if state is None:
            state = self.sink.load_table(ident, full_identity(rels[0][0]))
            if ident not in self._applied:
                self._applied[ident] = state.applied
        for rel, lsn in rels:
            if lsn <= state.applied:
                # The table holds that transaction already (it is skipped): its
                # schema is behind the table's, maybe another relation's, a table
                # dropped and created again, and copied since (copy/driver.py).
                continue
            state = self.sink.evolve_table(
                state, full_identity(self._declared(rel, state)), lsn=lsn
            )
        self._states[ident] = state
        return state

    def _declared(self, rel: m.Relation, state: contract.TableState) -> m.Relation:
        """``rel``, with the array columns the publisher declares with more than one
        dimension as text (convert/types.py, ARRAYS OF MORE THAN ONE DIMENSION): a
        RELATION cannot say it (convert/schema.py, ``arrays_not_held_as_lists``)."""
        if self.multidimensional is None:
            return rel
        asked = arrays_not_held_as_lists(rel, state.table.schema())
        return columns_as_text(rel, self.multidimensional(rel.relation_id, asked)) if asked else rel
