"""The commit: one Iceberg snapshot per table per batch, stamped with the source LSN.
(Several tables in one catalog transaction: ``atomic.py``.)

THE COMMIT

Executors have written new Parquet files under the table's data directory: data files
with new row versions and, for rows the batch replaced or deleted, position-delete
files naming (data file, row position) (merge-on-read; see ``rowdelta.py``).
:func:`commit_files` makes exactly one snapshot of the table from that: the added data
files and delete files, or, for TRUNCATE, every live file removed and the new rows
added. Its summary carries ``sparkapply.lsn``, the commit LSN of the last source
transaction it contains, and the same metadata commit sets the table property
``sparkapply.applied-lsn`` (see ``progress.py``). Pure appends go through pyiceberg's
own append (which rebases on a concurrent commit); anything with deletes goes through
the row-delta producer, which commits only on the snapshot the executors planned
against. ``removed`` (dropping whole data files, as a compaction does) goes through
pyiceberg's overwrite.

A batch whose changes to a table cancelled out (insert then delete of the same key)
still commits: an ``append`` snapshot with no files that records the LSN. It costs a
manifest list and a metadata file (a few ms), and it is what lets a restart skip those
transactions without re-reading them. The subscriber should not commit to a table a
batch did not touch at all: the slot's confirmed flush position already covers it.

WHAT IS DURABLE WHEN (and what a crash at each point leaves)

1. Executors write data files. Crash: unreferenced files under ``data/``; the table
   is unchanged. Restart replays from the applied LSN and writes new files under new
   names; the old ones are orphans for an orphan-file sweep (or :func:`remove_orphans`
   if the caller journaled their paths).
2. The driver reads the new files' footers (statistics, schema check: ``footers.py``).
   No effect.
3. pyiceberg writes a manifest, a manifest list and a new ``metadata.json`` under
   ``metadata/``. Crash: unreferenced metadata files, same as 1.
4. The catalog swaps the table's metadata pointer (one SQL transaction for the SQL
   catalog; one request for REST). This is the only commit point: before it readers
   and restarts see the old snapshot and the old applied LSN; after it they see all
   of the batch for this table and the new LSN. There is no state in between.
5. Crash after 4, before the flush LSN is acknowledged: the restart reads the new
   applied LSN and skips the replayed transactions at or below it for this table.

The apply stages every table of a batch (:func:`stage_files`: steps 1-3 but the
metadata file) and commits them together in one catalog transaction where the catalog
can (``atomic.py``: step 4 once for the whole batch, with its cut). Otherwise tables
commit one after another (:func:`commit_staged`), so a crash between two tables'
commits leaves them at different LSNs; each skips exactly its own applied prefix on
replay. The subscriber acknowledges at most the smallest applied LSN of the tables a
batch touched.

Durability is that of the catalog and the FileIO: a process crash loses nothing
committed; surviving an OS crash or power loss also needs the metadata and data files
to be on disk before step 4 (object stores guarantee that; pyiceberg's local FileIO
does not fsync).

CONCURRENT WRITERS

sparkapply must be the only writer of a table's rows; other tools may compact or
expire. pyiceberg detects a concurrent commit (its ``AssertRefSnapshotId``), refreshes
and retries with backoff (``commit.retry.*`` table properties), validating first:

- an ``append`` is retried on top of whatever committed meanwhile; rows it inserts
  do not depend on the files a compaction rewrote;
- an ``overwrite`` fails validation if a file it removes is gone or (serializable
  isolation, the default) any data file was added meanwhile: the executors' plan
  was made against files that changed.

``base_snapshot_id`` closes the window before the commit starts: when given, the
table must still be at the snapshot the executors planned against. Every refusal is a
:class:`CommitConflictError` (transient): re-load the table, re-plan the batch from
the spool. After a successful commit the parent lineage's LSN is checked again: if
another writer applied the same or later source transactions meanwhile, a fatal
:class:`SinkError` says two subscribers write one table.

FAILURE AND ORPHANS

The snapshot id is chosen before the commit and kept across retries, so it tells
whether a commit whose outcome was unclear (the catalog connection dropped) landed:
the table is refreshed and looked up. Outcomes:

- success (returned snapshot id);
- did not land (:class:`CommitConflictError`, or :class:`SinkError` raised before the
  catalog was asked: a missing or mismatching file): the added files are orphans; the
  caller may :func:`remove_orphans` them;
- :class:`CommitOutcomeUnknownError`: do not delete anything; re-load the table and
  compare :func:`applied_lsn` with the batch LSN (restart does exactly that).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update.snapshot import UpdateSnapshot
from pyiceberg.utils.properties import property_as_bool

from sparkapply.datafiles import DeleteFileInfo
from sparkapply.errors import (
    CommitConflictError,
    CommitOutcomeUnknownError,
    SinkArgumentError,
    SinkError,
)
from sparkapply.lsn import Lsn
from sparkapply.sink.files import delete_paths, live_data_files
from sparkapply.sink.footers import as_table_uri, check_paths, describe_added
from sparkapply.sink.producer import StagedChange, position_delete_file
from sparkapply.sink.progress import LSN_SUMMARY_KEY, LSN_TABLE_PROPERTY, applied_lsn, lineage_lsn
from sparkapply.sink.rowdelta import RowDelta
from sparkapply.sink.tables import table_name

logger = logging.getLogger(__name__)

EXTRA_SUMMARY_PREFIX = "sparkapply."


class _Base(enum.Enum):
    ANY = "any"


ANY_BASE: Literal[_Base.ANY] = _Base.ANY
"""``base_snapshot_id`` default: commit on top of whatever the table object holds."""


@dataclass(frozen=True, slots=True)
class StagedSnapshot:
    """One table's metadata change, written but for the catalog pointer: a snapshot
    (:func:`stage_files`), or a tag set or removed on ``snapshot_id`` (``ref``:
    ``cuts.py``)."""

    table: Table
    lsn: Lsn
    delta: StagedChange
    ref: str | None = None
    removes_ref: bool = False

    @property
    def snapshot_id(self) -> int:
        return self.delta.snapshot_id

    def landed(self, metadata: TableMetadata) -> bool:
        """Whether ``metadata`` (re-read after an unclear outcome) holds this change."""
        if self.ref is None:
            return metadata.snapshot_by_id(self.snapshot_id) is not None
        ref = metadata.refs.get(self.ref)
        if self.removes_ref:
            return ref is None
        return ref is not None and ref.snapshot_id == self.snapshot_id


def commit_files(
    table: Table,
    *,
    added: Sequence[str],
    removed: Sequence[str] = (),
    truncate: bool = False,
    deletes: Sequence[DeleteFileInfo] = (),
    lsn: Lsn,
    extra_summary: Mapping[str, str] | None = None,
    base_snapshot_id: int | Literal[_Base.ANY] | None = ANY_BASE,
) -> int:
    """Commit one snapshot of ``table``; return its id. See the module doc.

    ``added``: new Parquet files (no field ids; column names and types matching the
    table; key columns non-nullable). ``removed``: live data files to drop, spelled
    as :func:`current_data_files` returns them. ``truncate``: drop every live file
    (``removed`` is then implied). ``lsn``: the commit LSN of the last source
    transaction in the snapshot; must be above the table's applied LSN.
    ``deletes``: new position-delete files naming rows of live data files (a row
    delta: see ``rowdelta.py``; committed only on the exact snapshot planned against).
    ``extra_summary``: more summary entries, keys prefixed ``sparkapply.``.
    ``base_snapshot_id``: the snapshot the executors planned against (None for an
    empty table); the commit is refused if the table moved on.

    The ``table`` object is updated in place to the committed metadata.
    """
    lsn = Lsn(lsn)
    name = table_name(table)
    added = [as_table_uri(p, table) for p in added]
    summary = _summary(lsn, extra_summary)
    check_paths(added, removed)
    started = time.monotonic()

    _check_base_and_lsn(table, base_snapshot_id, lsn)

    to_remove = _files_to_remove(table, added, removed, lsn) if removed and not truncate else []
    new_files = describe_added(table, added, lsn)

    if deletes or truncate:
        if removed and not truncate:
            raise SinkError("a row delta cannot also remove data files", table=name, lsn=lsn)
        staged = _stage_row_delta(table, new_files, deletes, truncate, summary, lsn)
        commit_staged(staged)
        _log_commit(name, staged.snapshot_id, lsn, len(new_files), len(deletes), started)
        return staged.snapshot_id

    snapshot_id = _commit_transaction(table, new_files, to_remove, summary, lsn)
    _check_single_writer(table, snapshot_id, lsn)
    _log_commit(name, snapshot_id, lsn, len(new_files), -len(to_remove), started)
    return snapshot_id


def _files_to_remove(
    table: Table, added: Sequence[str], removed: Sequence[str], lsn: Lsn
) -> list[DataFile]:
    """The live entries of the data files ``removed`` names (their statistics keep the
    summary's totals right); every one must be live, none of ``added`` may be."""
    name = table_name(table)
    live = live_data_files(table)
    missing = [p for p in removed if p not in live]
    if missing:
        raise CommitConflictError(
            f"{len(missing)} data file(s) to remove are not in the table's current "
            f"snapshot, e.g. {missing[0]}",
            table=name,
            lsn=lsn,
            hint="the table changed since the batch was planned (or the paths are not "
            "spelled as current_data_files returns them); re-load and re-plan",
        )
    if already := [p for p in added if p in live]:
        raise SinkError(f"data file is already in the table: {already[0]}", table=name, lsn=lsn)
    return [live[p] for p in removed]


def _commit_transaction(
    table: Table,
    new_files: list[DataFile],
    to_remove: list[DataFile],
    summary: dict[str, str],
    lsn: Lsn,
) -> int:
    """An append or overwrite through pyiceberg's own producers (which rebase on a
    concurrent commit, validating first); return the snapshot id."""
    name = table_name(table)
    txn = table.transaction()
    try:
        txn.set_properties({LSN_TABLE_PROPERTY: str(lsn)})
        update = txn.update_snapshot(snapshot_properties=summary)
        merge = property_as_bool(
            table.properties,
            TableProperties.MANIFEST_MERGE_ENABLED,
            TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT,
        )
        snapshot_id = _stage(update, new_files, to_remove, merge=merge)
    except ValidationException as exc:
        raise CommitConflictError(
            f"the table changed under the commit: {exc}", table=name, lsn=lsn
        ) from exc
    except Exception as exc:
        raise _prepare_failed(exc, name, lsn) from exc

    try:
        txn.commit_transaction()
    except (CommitFailedException, ValidationException) as exc:
        raise CommitConflictError(
            f"concurrent commit to the table, retries exhausted or validation failed: {exc}",
            table=name,
            lsn=lsn,
            hint="nothing was committed; re-load the table and re-plan the batch",
        ) from exc
    except Exception as exc:
        resolve_unclear_outcome(table, snapshot_id, lsn, exc)
    return snapshot_id


def _log_commit(
    name: str, snapshot_id: int, lsn: Lsn, added: int, other: int, started: float
) -> None:
    logger.debug(
        "committed %s snapshot %s at LSN %s: +%d files, %+d removed/delete files in %.3fs",
        name,
        snapshot_id,
        lsn,
        added,
        other,
        time.monotonic() - started,
    )


def stage_files(
    table: Table,
    *,
    added: Sequence[str],
    deletes: Sequence[DeleteFileInfo] = (),
    truncate: bool = False,
    lsn: Lsn,
    base_snapshot_id: int | None,
    extra_summary: Mapping[str, str] | None = None,
) -> StagedSnapshot:
    """Write everything of one table's snapshot but the catalog pointer: the checks of
    :func:`commit_files`, manifests and manifest list. Commit it with
    :func:`commit_staged`, or with the batch's other tables in one catalog transaction
    (``atomic.py``). It commits only on ``base_snapshot_id`` (a row delta)."""
    lsn = Lsn(lsn)
    added = [as_table_uri(p, table) for p in added]
    summary = _summary(lsn, extra_summary)
    check_paths(added, ())
    _check_base_and_lsn(table, base_snapshot_id, lsn)
    new_files = describe_added(table, added, lsn)
    return _stage_row_delta(table, new_files, deletes, truncate, summary, lsn)


def _check_base_and_lsn(
    table: Table, base_snapshot_id: int | Literal[_Base.ANY] | None, lsn: Lsn
) -> None:
    """The table is still at the snapshot planned against, and ``lsn`` advances it."""
    name = table_name(table)
    if base_snapshot_id is not ANY_BASE and table.metadata.current_snapshot_id != base_snapshot_id:
        raise CommitConflictError(
            f"table moved from snapshot {base_snapshot_id} to "
            f"{table.metadata.current_snapshot_id} since the batch was planned",
            table=name,
            lsn=lsn,
            hint="re-load the table and re-plan the batch",
        )
    previous = applied_lsn(table)
    if previous is not None and lsn <= previous:
        raise SinkError(
            f"commit LSN does not advance: the table already contains up to {previous}",
            table=name,
            lsn=lsn,
            hint="transactions at or below a table's applied LSN must be skipped; a repeated "
            "commit after an unclear outcome must re-load the table first",
        )


def _stage_row_delta(
    table: Table,
    new_files: list[DataFile],
    deletes: Sequence[DeleteFileInfo],
    truncate: bool,
    summary: dict[str, str],
    lsn: Lsn,
) -> StagedSnapshot:
    """Data files + position deletes (or a TRUNCATE) as one snapshot; see rowdelta.py."""
    name = table_name(table)
    spec_id = table.metadata.default_spec_id
    try:
        staged = RowDelta(
            table,
            data_files=new_files,
            delete_files=[position_delete_file(d, spec_id) for d in deletes],
            remove_all=truncate,
            summary_properties=summary,
        ).stage(table_properties={LSN_TABLE_PROPERTY: str(lsn)})
    except Exception as exc:
        raise _prepare_failed(exc, name, lsn) from exc
    return StagedSnapshot(table, lsn, staged)


def commit_staged(staged: StagedSnapshot) -> None:
    """Commit one staged snapshot alone (one ``commit_table``); updates its table."""
    table, lsn, delta = staged.table, staged.lsn, staged.delta
    name = table_name(table)
    try:
        response = table.catalog.commit_table(table, delta.requirements, delta.updates)
    except CommitFailedException as exc:
        delete_paths(table.io, delta.written)
        raise CommitConflictError(
            f"the table changed under the commit: {exc}",
            table=name,
            lsn=lsn,
            hint="nothing was committed; re-load the table and re-plan the batch",
        ) from exc
    except Exception as exc:
        resolve_unclear_outcome(table, delta.snapshot_id, lsn, exc, landed=staged.landed)
        return
    table.metadata = response.metadata
    table.metadata_location = response.metadata_location


def _prepare_failed(exc: Exception, name: str, lsn: Lsn) -> SinkError:
    """A failure before the catalog was asked: nothing committed."""
    return SinkError(
        f"cannot prepare the commit: {type(exc).__name__}: {exc}",
        table=name,
        lsn=lsn,
        hint="nothing was committed; the added files are orphans",
    )


def _stage(
    update: UpdateSnapshot, new_files: list[DataFile], to_remove: list[DataFile], *, merge: bool
) -> int:
    """Stage the snapshot (writes manifests and the manifest list)."""
    if to_remove:
        with update.overwrite() as overwrite:
            for data_file in to_remove:
                overwrite.delete_data_file(data_file)
            for data_file in new_files:
                overwrite.append_data_file(data_file)
        return overwrite.snapshot_id
    with update.merge_append() if merge else update.fast_append() as append:
        for data_file in new_files:
            append.append_data_file(data_file)
    return append.snapshot_id


def resolve_unclear_outcome(
    table: Table,
    snapshot_id: int,
    lsn: Lsn,
    exc: Exception,
    *,
    landed: Callable[[TableMetadata], bool] | None = None,
) -> None:
    """Return if snapshot ``snapshot_id`` (or the change ``landed`` recognises) did land
    after all; raise otherwise."""
    name = table_name(table)
    try:
        table.refresh()
    except Exception:
        raise CommitOutcomeUnknownError(
            f"commit failed ({type(exc).__name__}: {exc}) and the table cannot be re-read",
            table=name,
            lsn=lsn,
            snapshot=snapshot_id,
            hint="do not remove the added files; on restart applied_lsn tells whether the "
            "snapshot landed",
        ) from exc
    found = landed or (lambda m: m.snapshot_by_id(snapshot_id) is not None)
    if found(table.metadata):
        logger.warning(
            "table %s: commit reported %s: %s, but snapshot %s is in the table: it landed",
            name,
            type(exc).__name__,
            exc,
            snapshot_id,
        )
        return
    raise CommitOutcomeUnknownError(
        f"commit failed ({type(exc).__name__}: {exc}); snapshot {snapshot_id} is not in the "
        "table as re-read",
        table=name,
        lsn=lsn,
        snapshot=snapshot_id,
        hint="re-load the table and compare applied_lsn with the batch LSN before retrying "
        "or removing the added files",
    ) from exc


def _check_single_writer(table: Table, snapshot_id: int, lsn: Lsn) -> None:
    """After pyiceberg retried on top of a concurrent commit: that commit must not have
    applied the same source transactions (a second subscriber writing this table)."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None or snapshot.parent_snapshot_id is None:
        return
    parent_lsn = lineage_lsn(table.metadata, snapshot.parent_snapshot_id)
    if parent_lsn is not None and parent_lsn >= lsn:
        raise SinkError(
            f"another writer committed LSN {parent_lsn} to the table while this commit "
            "was in flight: the table may now contain those changes twice",
            table=table_name(table),
            lsn=lsn,
            snapshot=snapshot_id,
            hint="run one subscriber per table; roll the table back to the snapshot before "
            f"{snapshot_id} and restart",
        )


def _summary(lsn: Lsn, extra: Mapping[str, str] | None) -> dict[str, str]:
    summary = {}
    for key, value in (extra or {}).items():
        if not key.startswith(EXTRA_SUMMARY_PREFIX) or key == LSN_SUMMARY_KEY:
            raise SinkArgumentError(
                f"extra summary key {key!r} must start with {EXTRA_SUMMARY_PREFIX!r} "
                f"and not be {LSN_SUMMARY_KEY!r}"
            )
        if not isinstance(value, str):
            raise SinkArgumentError(f"extra summary value for {key!r} must be a str")
        summary[key] = value
    summary[LSN_SUMMARY_KEY] = str(lsn)
    return summary
