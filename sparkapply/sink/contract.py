"""The sink contract: what the driver asks of table storage, and what each call promises.

A narrow interface, as supabase/etl's ``Destination``: :class:`Sink` names the calls
the apply makes, :class:`IcebergSink` keeps them with the functions of this package.
Everything else in ``sink/`` is how; this is what.

THE CALLS, in the order a batch makes them

1. :meth:`Sink.load_table` (once per table, or again after another writer committed):
   the table, created from the relation if missing, with its applied LSN and the
   snapshot to plan against. Reads only; creating a table is one catalog commit that
   is harmless to repeat.
2. :meth:`Sink.evolve_table` for each relation version the batch carries: the schema
   follows the publisher. One metadata commit when something changes, none otherwise;
   no snapshot, so the state's applied LSN and snapshot stay. Idempotent: repeating it
   after a crash finds the schema evolved and does nothing.
3. :meth:`Sink.live_files`: what the executors plan against (the state's snapshot).
4. The executors write data and position-delete files. Nothing is visible.
5. :meth:`Sink.commit_batch`: one snapshot per changed table, each on exactly the
   snapshot its state names, stamped with its LSN, and the batch's cut.
6. :meth:`Sink.expire` and :meth:`Sink.remove_files`, whenever: maintenance.

WHAT IS ATOMIC

Each table's change is one snapshot: all of its files and its new applied LSN, or
nothing. Where the catalog commits several tables at once (``atomic.py``), the whole
batch and its cut are one catalog transaction: every table or none. Otherwise tables
commit one after another and the cut last; readers may see two tables at different
LSNs for a moment, never a table half-applied.

A CRASH BETWEEN CALLS (or inside one)

Nothing the sink wrote is visible until a commit point, so a crash leaves either the
old snapshot or the new one, plus files nothing references (the orphan sweep removes
them). The restart calls :meth:`Sink.load_table` again: the applied LSN it returns is
the destination's own record of what landed, the only one to trust (acknowledge at
most the smallest over the batch's tables, replay from there, skip per table what it
already holds). A crash after a commit but before the acknowledgement replays
transactions the table holds; they are skipped, so each lands once.

WHAT MAY BE RETRIED

- :class:`~sparkapply.errors.CommitConflictError` from :meth:`Sink.commit_batch`:
  nothing of the tables not yet committed is visible and their files are removed;
  load the tables again and re-plan the batch from the spool.
- :class:`~sparkapply.errors.CommitOutcomeUnknownError`: do not retry blindly and
  remove nothing: load the tables again and compare their applied LSN with the
  batch's (the restart does exactly that).
- Any other :class:`~sparkapply.errors.SinkError` from a commit: nothing committed.
- :meth:`Sink.expire` and :meth:`Sink.remove_files` may always be repeated;
  :meth:`Sink.remove_files` never removes a file the table references.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sparkapply.convert.schema import iceberg_schema_for
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo
from sparkapply.errors import CommitOutcomeUnknownError, SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.lsn import Lsn
from sparkapply.pgoutput.messages import Relation
from sparkapply.sink.atomic import atomic_commits, commit_together
from sparkapply.sink.commit import StagedSnapshot, commit_staged, stage_files
from sparkapply.sink.cuts import Cut, CutLog
from sparkapply.sink.files import LiveFileCache, current_snapshot_id, remove_orphans
from sparkapply.sink.maintenance import expire_and_delete, expire_snapshots
from sparkapply.sink.progress import applied_lsn
from sparkapply.sink.relations import evolve_to
from sparkapply.sink.tables import TableIdentifier, ensure_table, note_added_to_rows


@dataclass(frozen=True, slots=True, eq=False)
class TableState:
    """A table as the driver plans against it."""

    ident: TableIdentifier
    table: Table
    applied: Lsn  # the last source commit the table holds; Lsn(0): none
    snapshot_id: int | None  # the snapshot planned against; None: an empty table


@dataclass(frozen=True, slots=True, eq=False)
class TableChange:
    """One table's share of a batch, as the executors wrote it."""

    state: TableState
    lsn: Lsn  # the commit LSN of the last source transaction in it
    added: Sequence[str] = ()
    deletes: Sequence[DeleteFileInfo] = ()
    truncate: bool = False

    @property
    def files(self) -> list[str]:
        """Every file the executors wrote for it (orphans if it does not commit)."""
        return [*self.added, *(d.path for d in self.deletes)]


@dataclass(frozen=True, slots=True)
class CutPoint:
    """Where the batch's cut stands: its last source commit (``cuts.py``)."""

    lsn: Lsn
    committed_at: dt.datetime | None  # None: a cut asked for by LSN
    requested: bool = False


@dataclass(frozen=True, slots=True)
class Retention:
    """Which snapshots an expiry keeps: the ``retain_last`` newest, those not older
    than ``older_than``, branch and tag heads, and ``keep`` (those kept cuts name);
    ``free_files``: also delete the files only the expired ones referenced."""

    older_than: dt.datetime
    retain_last: int
    keep: Collection[int] = ()
    free_files: bool = False


class Sink(Protocol):
    """The calls the driver makes; see the module doc for order and failure."""

    def load_table(self, ident: TableIdentifier, relation: Relation) -> TableState:
        """The table ``ident``, created with ``relation``'s columns if missing."""
        ...

    def evolve_table(self, state: TableState, relation: Relation, *, lsn: Lsn) -> TableState:
        """The table's schema following ``relation``; a change Iceberg cannot follow is
        a :class:`~sparkapply.errors.SchemaChangeError` naming table, column and LSN."""
        ...

    def live_files(
        self, state: TableState, key_column: str | None
    ) -> tuple[list[DataFileInfo], list[DeleteFileInfo]]:
        """The live data files (with ``key_column``'s bounds) and delete files."""
        ...

    def commit_batch(
        self, changes: Sequence[TableChange], *, cut: CutPoint | None = None
    ) -> list[int]:
        """Commit every change (and, with ``cut``, the batch's cut); return the new
        snapshot ids in the order of ``changes``."""
        ...

    def expire(self, table: Table, retention: Retention) -> int:
        """Expire the snapshots ``retention`` does not keep; return how many."""
        ...

    def remove_files(self, table: Table, paths: Iterable[str]) -> list[str]:
        """Delete files a failed commit left behind; never one the table references."""
        ...


class IcebergSink:
    """:class:`Sink` on an Iceberg catalog. ``atomic`` (by default, whenever the
    catalog can): a batch is one catalog transaction. ``cuts``: each batch records a
    cut. Not thread-safe: the apply thread calls it."""

    def __init__(
        self, catalog: Catalog, *, atomic: bool | None = None, cuts: CutLog | None = None
    ) -> None:
        self.catalog = catalog
        self.atomic = atomic_commits(catalog) if atomic is None else atomic
        self.cuts = cuts
        self._files = LiveFileCache()  # see files.py, THE LISTING CACHE

    def load_table(self, ident: TableIdentifier, relation: Relation) -> TableState:
        table = ensure_table(self.catalog, ident, iceberg_schema_for(relation))
        return TableState(ident, table, applied_lsn(table) or Lsn(0), current_snapshot_id(table))

    def evolve_table(self, state: TableState, relation: Relation, *, lsn: Lsn) -> TableState:
        # Read before: a commit updates the Table object it was made on, in place.
        held = {f.name for f in state.table.schema().fields}
        table = evolve_to(self.catalog, state.ident, state.table, relation, lsn=lsn)
        # The stream's own evolution says what it leaves null (a copy's fills them).
        note_added_to_rows(table, [f.name for f in table.schema().fields if f.name not in held])
        return dataclasses.replace(state, table=table, snapshot_id=current_snapshot_id(table))

    def live_files(
        self, state: TableState, key_column: str | None
    ) -> tuple[list[DataFileInfo], list[DeleteFileInfo]]:
        return self._files.listing(state.table, key_column)

    def commit_batch(
        self, changes: Sequence[TableChange], *, cut: CutPoint | None = None
    ) -> list[int]:
        staged: list[StagedSnapshot] = []
        committed = 0  # table by table: how many have committed
        try:
            for change in changes:
                staged.append(_stage(change))
            cut_staged = self._stage_cut(staged, cut)
            if self.atomic:
                commit_together(self.catalog, [*staged, *([cut_staged[0]] if cut_staged else [])])
            else:
                for one in staged:
                    commit_staged(one)
                    committed += 1
                    failpoint("after-table-commit")
                if cut_staged is not None:
                    commit_staged(cut_staged[0])
            if self.cuts is not None and cut_staged is not None:
                self.cuts.committed(staged, cut_staged[1])
        except SparkapplyError as exc:
            if not isinstance(exc, CommitOutcomeUnknownError):  # else they may be live
                for change in changes[committed:]:
                    remove_orphans(change.state.table, change.files)
            raise
        return [one.snapshot_id for one in staged]

    def _stage_cut(
        self, staged: list[StagedSnapshot], cut: CutPoint | None
    ) -> tuple[StagedSnapshot, Cut] | None:
        """The batch's cut, staged: when cuts are kept and the batch changed a table
        (or the cut was asked for by LSN)."""
        if self.cuts is None or cut is None or not (staged or cut.requested):
            return None
        return self.cuts.stage(
            staged, lsn=cut.lsn, committed_at=cut.committed_at, requested=cut.requested
        )

    def expire(self, table: Table, retention: Retention) -> int:
        older_than, retain_last, keep = retention.older_than, retention.retain_last, retention.keep
        if retention.free_files:
            outcome = expire_and_delete(
                table, older_than=older_than, retain_last=retain_last, keep=keep
            )
            return outcome.snapshots_expired
        return expire_snapshots(table, older_than=older_than, retain_last=retain_last, keep=keep)

    def remove_files(self, table: Table, paths: Iterable[str]) -> list[str]:
        return remove_orphans(table, paths)


def _stage(change: TableChange) -> StagedSnapshot:
    return stage_files(
        change.state.table,
        added=change.added,
        deletes=change.deletes,
        truncate=change.truncate,
        lsn=change.lsn,
        base_snapshot_id=change.state.snapshot_id,
    )
