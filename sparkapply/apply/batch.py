"""Apply one batch of committed transactions: tables, one Spark job, one commit per table.

The driver half of the apply. ORDERING
    The batch's transactions are in source commit order. Per table they form a chain
    (see :mod:`sparkapply.plan.graph`); one Spark task folds a table's chain and writes
    its files (new row versions as data files, replaced rows as position deletes:
    merge-on-read); the driver commits one snapshot per table stamped with the commit
    LSN of the last transaction it contains.

FAILURE AND RESTART
    Nothing is acknowledged until every table of the batch has committed. A crash
    between two tables' commits leaves them at different applied LSNs; on restart the
    server re-sends from the slot's confirmed position and each table skips the
    transactions at or below its own applied LSN, so nothing is applied twice.
    A failed task or commit removes the files the batch wrote (orphans) and raises.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from sparkapply.apply.driver import run_tasks
from sparkapply.apply.fold import TxnInput
from sparkapply.apply.tasks import TableResult, TableTask
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.convert.schema import iceberg_schema_for, relation_identifier
from sparkapply.errors import SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import messages as m
from sparkapply.plan.graph import lanes
from sparkapply.sink.arrow import arrow_schema_of
from sparkapply.sink.commit import commit_files
from sparkapply.sink.files import (
    DataFileInfo,
    LiveFileCache,
    current_snapshot_id,
    remove_orphans,
)
from sparkapply.sink.maintenance import expire_and_delete, expire_snapshots
from sparkapply.sink.progress import applied_lsn
from sparkapply.sink.relations import evolve_to
from sparkapply.sink.rowdelta import DeleteFileInfo
from sparkapply.sink.tables import data_directory, ensure_table

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

TableIdent = tuple[str, str]


@dataclass(slots=True)
class BatchStats:
    transactions: int = 0
    changes: int = 0
    tables: int = 0
    rows_written: int = 0
    rows_removed: int = 0
    skipped: int = 0
    commit_seconds: float = 0.0  # the Iceberg commits of the batch, all tables
    results: list[TableResult] = field(default_factory=list)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a batch is planned and applied.

    Planning 20,000 one-row transactions makes some 100,000 short-lived objects (task
    inputs, tuples) while the driver holds the batch's transactions and Spark's and
    pyiceberg's objects; one full collection over them was measured at 0.2 s, as much
    as the planning itself. The apply makes no reference cycles worth collecting
    during it; the collector runs after it. (Another thread may pause the collector
    too: whoever resumes it first ends both pauses, which only costs time.)
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _full_identity(rel: m.Relation) -> m.Relation:
    """REPLICA IDENTITY FULL flags every column as key; it has no key to index by."""
    if rel.replica_identity != "f":
        return rel
    cols = tuple(m.RelationColumn(0, c.name, c.type_oid, c.type_modifier) for c in rel.columns)
    return m.Relation(rel.xid, rel.relation_id, rel.namespace, rel.name, rel.replica_identity, cols)


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
        free_expired_files: bool = False,
    ) -> None:
        self.spark = spark
        self.catalog = catalog
        self.table_map = table_map or {}
        self.proto_version = proto_version
        self.streaming = streaming
        self._tables: dict[TableIdent, Table] = {}
        self._applied: dict[tuple[str, str], Lsn] = {}
        self._known: set[TableIdent] = set()
        # Live files by manifest: a batch reads only the manifests new since the last
        # (see sink/files.py, THE LISTING CACHE).
        self._files = LiveFileCache()
        self.retain_snapshots = retain_snapshots
        self.split_bytes = split_bytes
        # With maintenance on, expiry here also deletes the files only expired
        # snapshots referenced (otherwise they wait for the orphan sweep's grace).
        self.free_expired_files = free_expired_files
        self.max_tasks_per_table = max_tasks_per_table

    def identifier(self, rel: m.Relation) -> tuple[str, str]:
        return relation_identifier(rel, self.table_map)

    def applied(self, ident: tuple[str, str]) -> Lsn:
        return self._applied.get(ident, Lsn(0))

    def known_tables(self) -> list[TableIdent]:
        """Every table this applier has written to or loaded (for maintenance)."""
        return sorted(self._known)

    def forget(self, ident: TableIdent) -> None:
        """Drop what is cached of a table another writer (the copy) committed to."""
        self._tables.pop(ident, None)
        self._applied.pop(ident, None)

    def apply(self, batch: Sequence[CommittedTxn]) -> BatchStats:
        with _collector_paused():
            return self._apply(batch)

    def _apply(self, batch: Sequence[CommittedTxn]) -> BatchStats:
        stats = BatchStats(transactions=len(batch))
        # Relation versions in apply order, and which table each relation id is.
        versions: dict[tuple[str, str], list[tuple[m.Relation, Lsn]]] = {}
        relid_table: dict[int, tuple[str, str]] = {}
        last_seen: dict[int, m.Relation] = {}  # the relation object each id had last
        for txn in batch:
            for rel in [*txn.relations.values(), *txn.relation_messages]:
                if last_seen.get(rel.relation_id) is rel:
                    continue  # the same cache entry as the previous transaction's
                last_seen[rel.relation_id] = rel
                ident = self.identifier(rel)
                relid_table[rel.relation_id] = ident
                seen = versions.setdefault(ident, [])
                if (
                    not seen
                    or seen[-1][0].columns != rel.columns
                    or (seen[-1][0].replica_identity != rel.replica_identity)
                ):
                    seen.append((rel, txn.commit_lsn))
        names = {rid: ".".join(ident) for rid, ident in relid_table.items()}
        table_lanes = lanes(batch, names.__getitem__)

        tasks: list[TableTask] = []
        planned: dict[str, tuple[Table, TableIdent, int | None]] = {}
        for ident, rels in versions.items():
            table = self._table(ident, rels)
            applied = self.applied(ident)
            name = ".".join(ident)
            lane = table_lanes.get(name, [])
            ordinals = [o for o in lane if batch[o].commit_lsn > applied]
            stats.skipped += len(lane) - len(ordinals)
            if not ordinals:
                continue
            relids = frozenset(rid for rid, t in relid_table.items() if t == ident)
            insert_only = all(
                batch[o].mutated_relation_ids is not None
                and not relids.intersection(batch[o].mutated_relation_ids)  # type: ignore[arg-type]
                for o in ordinals
            )
            latest = _full_identity(rels[-1][0])
            key_names = tuple(c.name for c in latest.columns if c.is_key)
            data_files: list[DataFileInfo] = []
            delete_files: list[DeleteFileInfo] = []
            if not insert_only:
                key_column = key_names[0] if len(key_names) == 1 else None
                data_files, delete_files = self._files.listing(table, key_column)
            txns = tuple(
                TxnInput(
                    ordinal=o,
                    xid=batch[o].xid,
                    commit_lsn=int(batch[o].commit_lsn),
                    segments=batch[o].segments,
                    relations=tuple(r for rid, r in batch[o].relations.items() if rid in relids),
                )
                for o in ordinals
            )
            tasks.append(
                TableTask(
                    table=name,
                    relation_ids=relids,
                    keyed=bool(key_names),
                    key_names=key_names,
                    txns=txns,
                    schema=arrow_schema_of(table),
                    data_files=tuple(data_files),
                    delete_files=tuple(delete_files),
                    data_dir=data_directory(table),
                    proto_version=self.proto_version,
                    streaming=self.streaming,
                    insert_only=insert_only,
                )
            )
            planned[name] = (table, ident, current_snapshot_id(table))
        stats.tables = len(tasks)
        results = run_tasks(
            self.spark,
            tasks,
            split_bytes=self.split_bytes,
            max_tasks_per_table=self.max_tasks_per_table,
        )
        failed = [r for r in results if r.error is not None]
        if failed:
            for r in results:
                remove_orphans(planned[r.table][0], [*r.added, *(d.path for d in r.deletes)])
            err = failed[0].error
            assert err is not None
            raise err
        if any(r.deletes for r in results):
            failpoint("deletes-written")
        failpoint("before-commit")
        commit_started = time.monotonic()
        for r in results:
            table, ident, base = planned[r.table]
            try:
                commit_files(
                    table,
                    added=r.added,
                    deletes=r.deletes,
                    truncate=r.truncated,
                    lsn=Lsn(r.last_commit_lsn),
                    base_snapshot_id=base,
                )
            except SparkapplyError:
                remove_orphans(table, [*r.added, *(d.path for d in r.deletes)])
                raise
            failpoint("after-table-commit")
            self._expire(table)
            self._applied[ident] = Lsn(r.last_commit_lsn)
            self._tables.pop(ident, None)
            stats.changes += r.n_changes
            stats.rows_written += r.rows_written
            stats.rows_removed += r.rows_removed
        stats.commit_seconds = time.monotonic() - commit_started
        stats.results = results
        return stats

    def _expire(self, table: Table) -> None:
        """Keep commits cheap: a commit's cost grows with the snapshots a table keeps."""
        keep = self.retain_snapshots
        if keep <= 0 or len(table.metadata.snapshots) <= keep + keep // 2:
            return
        try:
            now = dt.datetime.now(dt.UTC)
            if self.free_expired_files:
                expire_and_delete(table, older_than=now, retain_last=keep)
            else:
                expire_snapshots(table, older_than=now, retain_last=keep)
        except SparkapplyError as exc:  # maintenance: try again after a later batch
            log.warning("%s", exc)

    def _table(self, ident: TableIdent, rels: list[tuple[m.Relation, Lsn]]) -> Table:
        self._known.add(ident)
        table = self._tables.get(ident)
        if table is None:
            first = _full_identity(rels[0][0])
            table = ensure_table(self.catalog, ident, iceberg_schema_for(first))
            if ident not in self._applied:
                self._applied[ident] = applied_lsn(table) or Lsn(0)
        for rel, lsn in rels:
            table = evolve_to(self.catalog, ident, table, _full_identity(rel), lsn=lsn)
        self._tables[ident] = table
        return table
