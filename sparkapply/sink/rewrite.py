"""Replace snapshots: rewrite data and delete files without changing a table's rows.

Compaction swaps data files for new ones holding the same live rows, drops the
position-delete files that only named the swapped files, and may swap many small
delete files for one. pyiceberg 0.12 can neither remove a delete file nor commit a
``replace`` snapshot, so this module builds one from pyiceberg's manifest classes, like
``rowdelta.py`` does for the apply (remove both when pyiceberg gains RewriteFiles).

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
committed, the manifests written are removed) if anything committed meanwhile. A
compaction never rebases: the apply's next row delta names positions of files as they
were, so a rewrite must not land between its planning and its commit, and the apply's
commit (also asserting its base) refuses to land after a rewrite it did not see.
"""

# pyiceberg's pydantic models accept field names at runtime; without the pydantic mypy
# plugin mypy only knows their aliases ("snapshot-id").
# mypy: disable-error-code="call-arg"

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.utils.concurrent import ExecutorFactory

from sparkapply.datafiles import DeleteFileInfo
from sparkapply.errors import CommitConflictError, SinkError
from sparkapply.sink.files import delete_paths
from sparkapply.sink.progress import LSN_SUMMARY_KEY
from sparkapply.sink.rowdelta import DeleteManifestWriter, position_delete_file
from sparkapply.sink.tables import table_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RewriteOutcome:
    snapshot_id: int
    data_files_added: int
    data_files_removed: int
    delete_files_added: int
    delete_files_removed: int


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
    name = table_name(table)
    if table.metadata.current_snapshot_id != base_snapshot_id:
        raise CommitConflictError(
            f"table moved from snapshot {base_snapshot_id} to "
            f"{table.metadata.current_snapshot_id} since the rewrite was planned",
            table=name,
            hint="nothing was committed; plan the rewrite again",
        )
    parent = table.current_snapshot()
    if parent is None:
        raise SinkError("a rewrite needs a table with a snapshot", table=name)
    new_data = _describe(table, added_data)
    spec_id = table.metadata.default_spec_id
    new_deletes = [position_delete_file(d, spec_id) for d in added_deletes]
    metadata = table.metadata
    io = table.io
    snapshot_id = metadata.new_snapshot_id()
    sequence_number = metadata.next_sequence_number()
    compression = metadata.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    spec, schema = metadata.spec(), metadata.schema()
    provider = table.location_provider()
    commit_uuid = uuid.uuid4()
    written: list[str] = []

    def writer(content: ManifestContent) -> ManifestWriter:
        path = provider.new_metadata_location(f"{commit_uuid}-r{len(written)}.avro")
        written.append(path)
        cls = DeleteManifestWriter if content == ManifestContent.DELETES else ManifestWriterV2
        return cls(spec, schema, io.new_output(path), snapshot_id, compression)  # type: ignore[arg-type]

    live: dict[ManifestContent, list[ManifestEntry]] = {
        ManifestContent.DATA: [],
        ManifestContent.DELETES: [],
    }
    for manifest in parent.manifests(io):
        if manifest.has_added_files() or manifest.has_existing_files():
            live[manifest.content].extend(manifest.fetch_manifest_entry(io, discard_deleted=True))
    gone = set(removed)
    found = {e.data_file.file_path for entries in live.values() for e in entries} & gone
    if missing := sorted(gone - found):
        raise CommitConflictError(
            f"{len(missing)} file(s) to remove are not live in snapshot {base_snapshot_id}, "
            f"e.g. {missing[0]}",
            table=name,
            hint="nothing was committed; plan the rewrite again",
        )

    collector = SnapshotSummaryCollector()
    counts = {"data+": len(new_data), "data-": 0, "del+": len(new_deletes), "del-": 0}
    manifests: list[ManifestFile] = []
    try:
        for content, added in (
            (ManifestContent.DATA, new_data),
            (ManifestContent.DELETES, new_deletes),
        ):
            entries = live[content]
            if not entries and not added:
                continue
            with writer(content) as w:
                for f in added:
                    w.add(_added(snapshot_id, f))
                    collector.add_file(f, schema, spec)
                for entry in entries:
                    if entry.data_file.file_path in gone:
                        w.delete(entry)
                        collector.remove_file(entry.data_file, schema, spec)
                        counts["data-" if content == ManifestContent.DATA else "del-"] += 1
                    else:
                        w.existing(entry)
            manifests.append(w.to_manifest_file())
        carried = {}
        if parent.summary is not None:
            lsn = parent.summary.additional_properties.get(LSN_SUMMARY_KEY)
            if lsn is not None:
                carried[LSN_SUMMARY_KEY] = lsn
        # pyiceberg totals only append/overwrite/delete; the totals are the same.
        summary = update_snapshot_summaries(
            Summary(operation=Operation.OVERWRITE, **collector.build(), **carried),
            parent.summary,
        )
        summary = Summary(Operation.REPLACE, **summary.additional_properties)
        list_path = provider.new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
        written.append(list_path)
        with write_manifest_list(
            format_version=2,
            output_file=io.new_output(list_path),
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent.snapshot_id,
            sequence_number=sequence_number,
            avro_compression=compression,  # type: ignore[arg-type]
        ) as manifest_list:
            manifest_list.add_manifests(manifests)
    except Exception as exc:
        delete_paths(table.io, written)
        raise SinkError(
            f"cannot prepare the rewrite: {type(exc).__name__}: {exc}",
            table=name,
            hint="nothing was committed; the files the rewrite wrote are orphans",
        ) from exc

    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=sequence_number,
        manifest_list=list_path,
        summary=summary,
        schema_id=metadata.current_schema_id,
    )
    updates = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent.snapshot_id,
        ),
    )
    requirements = (AssertRefSnapshotId(snapshot_id=parent.snapshot_id, ref=MAIN_BRANCH),)
    try:
        response = table.catalog.commit_table(table, requirements, updates)
    except CommitFailedException as exc:
        delete_paths(table.io, written)
        raise CommitConflictError(
            f"the table changed under the rewrite: {exc}",
            table=name,
            hint="nothing was committed; plan the rewrite again",
        ) from exc
    except Exception as exc:
        raise SinkError(
            f"the rewrite commit failed: {type(exc).__name__}: {exc}",
            table=name,
            snapshot=snapshot_id,
            hint="the outcome is unknown; reload the table: either way its rows are "
            "unchanged, and files left behind are removed by the orphan sweep",
        ) from exc
    table.metadata = response.metadata
    table.metadata_location = response.metadata_location
    return RewriteOutcome(
        snapshot_id, counts["data+"], counts["data-"], counts["del+"], counts["del-"]
    )


def _added(snapshot_id: int, data_file: DataFile) -> ManifestEntry:
    return ManifestEntry.from_args(
        status=ManifestEntryStatus.ADDED,
        snapshot_id=snapshot_id,
        sequence_number=None,
        file_sequence_number=None,
        data_file=data_file,
    )


def _describe(table: Table, paths: Sequence[str]) -> list[DataFile]:
    """Footer statistics of the new data files (and the schema check), in parallel."""
    metadata, io = table.metadata, table.io
    executor = ExecutorFactory.get_or_create()
    futures = [executor.submit(parquet_file_to_data_file, io, metadata, p) for p in paths]
    out = []
    for path, future in zip(paths, futures, strict=True):
        try:
            data_file = future.result()
        except Exception as exc:
            raise SinkError(
                f"cannot add rewritten data file: {type(exc).__name__}: {exc}",
                table=table_name(table),
                file=path,
                hint="nothing was committed; the rewritten files are orphans",
            ) from exc
        if data_file.content != DataFileContent.DATA:
            raise SinkError("not a data file", table=table_name(table), file=path)
        out.append(data_file)
    return out
