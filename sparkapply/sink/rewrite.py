"""Replace snapshots: rewrite data and delete files without changing a table's rows.

Compaction swaps data files for new ones holding the same live rows, drops the
position-delete files that only named the swapped files, and may swap many small
delete files for one. pyiceberg 0.12 can neither remove a delete file nor commit a
``replace`` snapshot, so this module builds one on the snapshot producer of
``producer.py``, as ``rowdelta.py`` does for the apply (remove both when pyiceberg
gains RewriteFiles).

WHAT A REPLACE SNAPSHOT HOLDS

Every live entry of the parent is rewritten into at most two new manifests, one for
data files and one for delete files, which is also how manifests are merged:

- kept files as EXISTING, with their original snapshot id and data and file sequence
  numbers (a position delete applies to data files whose data sequence number is at
  most its own: keeping the numbers keeps every delete applying as before);
- removed files as DELETED (readers skip them; the summary's totals drop them);
- new files as ADDED with this snapshot's sequence number. A new data file is never
  named by an older delete file (names are UUIDs); a new delete file names only rows
  an older delete file already named, of data files that are still live.

The summary says ``replace`` and carries the parent's ``sparkapply.lsn``, so the
applied LSN read back from the lineage (``progress.py``) is unchanged; the table
property ``sparkapply.applied-lsn`` is not touched.

CONCURRENT CHANGE

The caller planned against one snapshot: the commit carries an
``AssertRefSnapshotId`` for it and is refused (:class:`CommitConflictError`, nothing
committed, the manifests written are removed) if anything committed meanwhile. The
apply's row delta names positions of files as they were, so a rewrite must not land
between an apply's planning and its commit, and the apply's commit (also asserting its
base) refuses to land after a rewrite it did not see. A compaction that batches
overtook carries their deletes over itself (``maintain/rebase.py``) and names the
snapshot it carried them to.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestFile,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot

from sparkapply.datafiles import DeleteFileInfo
from sparkapply.errors import CommitConflictError, SinkError
from sparkapply.sink.files import delete_paths
from sparkapply.sink.footers import describe_rewritten
from sparkapply.sink.manifest_reads import READS
from sparkapply.sink.producer import SnapshotProducer, StagedChange, position_delete_file
from sparkapply.sink.progress import LSN_SUMMARY_KEY
from sparkapply.sink.tables import table_name

logger = logging.getLogger(__name__)

_REPLAN = "nothing was committed; plan the rewrite again"

LiveEntries = dict[ManifestContent, list[ManifestEntry]]
"""The parent's live manifest entries, data and deletes."""


@dataclass(frozen=True, slots=True)
class RewriteOutcome:
    snapshot_id: int
    data_files_added: int
    data_files_removed: int
    delete_files_added: int
    delete_files_removed: int


class Replace(SnapshotProducer):
    """Rewrites every live entry of the parent into at most one data and one delete
    manifest: ``removed`` paths as DELETED, the others as EXISTING, new files ADDED."""

    manifest_prefix = "r"

    def __init__(
        self,
        table: Table,
        live: LiveEntries,
        *,
        data_files: Sequence[DataFile],
        delete_files: Sequence[DataFile],
        removed: set[str],
    ) -> None:
        super().__init__(table, _carried_lsn(table.current_snapshot()))
        self._live = live
        self._added = {ManifestContent.DATA: data_files, ManifestContent.DELETES: delete_files}
        self._removed = removed

    @property
    def operation(self) -> Operation:
        return Operation.REPLACE

    def _manifests(self) -> list[ManifestFile]:
        return [
            self._write_manifest(content, added, self._live[content], self._removes)
            for content, added in self._added.items()
            if added or self._live[content]
        ]

    def _removes(self, data_file: DataFile) -> bool:
        return data_file.file_path in self._removed


def commit_rewrite(
    table: Table,
    *,
    base_snapshot_id: int,
    added_data: Sequence[str] = (),
    added_deletes: Sequence[DeleteFileInfo] = (),
    removed: Sequence[str] = (),
) -> RewriteOutcome:
    """Commit one ``replace`` snapshot on ``base_snapshot_id``; see the module doc.

    ``added_data``: new Parquet data files (as executors write them). ``added_deletes``:
    new position-delete files. ``removed``: live data or delete files to drop, spelled
    as the manifests record them. With nothing added or removed it merges the
    manifests. The ``table`` object is updated in place to the committed metadata.
    """
    parent = _parent(table, base_snapshot_id)
    new_data = describe_rewritten(table, added_data)
    spec_id = table.metadata.default_spec_id
    new_deletes = [position_delete_file(d, spec_id) for d in added_deletes]
    live = _live_entries(table, parent, base_snapshot_id, set(removed))
    producer = Replace(
        table, live, data_files=new_data, delete_files=new_deletes, removed=set(removed)
    )
    try:
        staged = producer.stage()
    except Exception as exc:
        delete_paths(table.io, producer.written)
        raise SinkError(
            f"cannot prepare the rewrite: {type(exc).__name__}: {exc}",
            table=table_name(table),
            hint="nothing was committed; the files the rewrite wrote are orphans",
        ) from exc
    _commit(table, staged)
    gone = producer.removed
    return RewriteOutcome(
        staged.snapshot_id,
        len(new_data),
        gone[ManifestContent.DATA],
        len(new_deletes),
        gone[ManifestContent.DELETES],
    )


def _parent(table: Table, base_snapshot_id: int) -> Snapshot:
    """The snapshot planned against, still the table's current one."""
    name = table_name(table)
    if table.metadata.current_snapshot_id != base_snapshot_id:
        raise CommitConflictError(
            f"table moved from snapshot {base_snapshot_id} to "
            f"{table.metadata.current_snapshot_id} since the rewrite was planned",
            table=name,
            hint=_REPLAN,
        )
    parent = table.current_snapshot()
    if parent is None:
        raise SinkError("a rewrite needs a table with a snapshot", table=name)
    return parent


def _live_entries(
    table: Table, parent: Snapshot, base_snapshot_id: int, removed: set[str]
) -> LiveEntries:
    """The parent's live entries; every file to remove must be one of them."""
    live: LiveEntries = {ManifestContent.DATA: [], ManifestContent.DELETES: []}
    for manifest in READS.manifests(parent, table.io):
        if manifest.has_added_files() or manifest.has_existing_files():
            live[manifest.content].extend(READS.live_entries(manifest, table.io))
    found = {e.data_file.file_path for entries in live.values() for e in entries} & removed
    if missing := sorted(removed - found):
        raise CommitConflictError(
            f"{len(missing)} file(s) to remove are not live in snapshot {base_snapshot_id}, "
            f"e.g. {missing[0]}",
            table=table_name(table),
            hint=_REPLAN,
        )
    return live


def _carried_lsn(parent: Snapshot | None) -> dict[str, str]:
    """The parent's ``sparkapply.lsn``: a rewrite leaves the applied LSN as it was."""
    if parent is None or parent.summary is None:
        return {}
    lsn = parent.summary.additional_properties.get(LSN_SUMMARY_KEY)
    return {} if lsn is None else {LSN_SUMMARY_KEY: lsn}


def _commit(table: Table, staged: StagedChange) -> None:
    """One ``commit_table``; the ``table`` object then holds the committed metadata."""
    try:
        response = table.catalog.commit_table(table, staged.requirements, staged.updates)
    except CommitFailedException as exc:
        delete_paths(table.io, staged.written)
        raise CommitConflictError(
            f"the table changed under the rewrite: {exc}", table=table_name(table), hint=_REPLAN
        ) from exc
    except Exception as exc:
        raise SinkError(
            f"the rewrite commit failed: {type(exc).__name__}: {exc}",
            table=table_name(table),
            snapshot=staged.snapshot_id,
            hint="the outcome is unknown; reload the table: either way its rows are "
            "unchanged, and files left behind are removed by the orphan sweep",
        ) from exc
    table.metadata = response.metadata
    table.metadata_location = response.metadata_location
