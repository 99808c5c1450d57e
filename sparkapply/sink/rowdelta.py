"""Row deltas: one snapshot that adds data files and position-delete files.

pyiceberg 0.12 writes neither delete files nor delete manifests, so merge-on-read needs
this small producer, built only from pyiceberg's manifest, manifest-list and snapshot
classes. It is the one place that knows how; remove it when pyiceberg gains row deltas
(apache/iceberg-python PR 4002) and call that instead.

WHAT A ROW DELTA SNAPSHOT HOLDS

- A data manifest with the new data files (status ADDED, sequence number inherited
  from the snapshot).
- A delete manifest (content ``deletes``) with the new position-delete files. A
  position delete applies to a data file whose data sequence number is at most the
  delete file's; both get this snapshot's sequence number, but the delete files only
  name positions in files committed earlier, so they never touch the new data files.
- Every live manifest of the parent, carried forward unchanged; or, for a TRUNCATE,
  none of them: their live entries are recorded as DELETED in this snapshot's own
  manifests, so the summary's totals and incremental readers stay right.
- A summary from pyiceberg's collector (added/deleted files, position deletes, totals).

The commit is one catalog ``commit_table`` with an ``AssertRefSnapshotId`` on ``main``:
it lands on exactly the snapshot the executors planned against or not at all. There is
no automatic rebase: the positions name rows of the files that were live then.
"""

# pyiceberg's pydantic models accept field names at runtime; without the pydantic mypy
# plugin mypy only knows their aliases ("snapshot-id").
# mypy: disable-error-code="call-arg"

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
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
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)
from pyiceberg.typedef import Record

from sparkapply.datafiles import FILE_PATH_FIELD_ID, POS_FIELD_ID, DeleteFileInfo

_LONG = struct.Struct("<q")


def position_delete_file(info: DeleteFileInfo, spec_id: int) -> DataFile:
    """The manifest entry's file description of a position-delete file."""
    data_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=info.path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=info.record_count,
        file_size_in_bytes=info.file_size_in_bytes,
        lower_bounds={
            FILE_PATH_FIELD_ID: info.lower_path.encode(),
            POS_FIELD_ID: _LONG.pack(info.lower_pos),
        },
        upper_bounds={
            FILE_PATH_FIELD_ID: info.upper_path.encode(),
            POS_FIELD_ID: _LONG.pack(info.upper_pos),
        },
        value_counts={FILE_PATH_FIELD_ID: info.record_count, POS_FIELD_ID: info.record_count},
        null_value_counts={FILE_PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
    )
    data_file.spec_id = spec_id
    return data_file


class _DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, declaring ``deletes`` content."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


DeleteManifestWriter = _DeleteManifestWriter
"""The delete-manifest writer, for the other snapshot producers in sink/ (rewrite.py)."""


@dataclass(slots=True)
class StagedRowDelta:
    snapshot_id: int
    updates: tuple[TableUpdate, ...]
    requirements: tuple[TableRequirement, ...]
    written: list[str]  # manifests and the manifest list (orphans if the commit fails)


def stage_row_delta(
    table: Table,
    *,
    data_files: Sequence[DataFile],
    delete_files: Sequence[DataFile],
    remove_all: bool,
    summary_properties: Mapping[str, str],
    table_properties: Mapping[str, str],
) -> StagedRowDelta:
    """Write the manifests and manifest list of a row-delta snapshot; return the
    metadata updates that commit it (not yet committed)."""
    metadata = table.metadata
    io = table.io
    parent = table.current_snapshot()
    snapshot_id = metadata.new_snapshot_id()
    sequence_number = metadata.next_sequence_number()
    compression = metadata.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    spec = metadata.spec()
    schema = metadata.schema()
    commit_uuid = uuid.uuid4()
    provider = table.location_provider()
    written: list[str] = []
    counter = iter(range(1_000_000))

    def writer(content: ManifestContent) -> ManifestWriter:
        path = provider.new_metadata_location(f"{commit_uuid}-m{next(counter)}.avro")
        written.append(path)
        cls = _DeleteManifestWriter if content == ManifestContent.DELETES else ManifestWriterV2
        return cls(spec, schema, io.new_output(path), snapshot_id, compression)  # type: ignore[arg-type]

    collector = SnapshotSummaryCollector()
    manifests: list[ManifestFile] = []
    for content, files in (
        (ManifestContent.DATA, data_files),
        (ManifestContent.DELETES, delete_files),
    ):
        if not files:
            continue
        with writer(content) as w:
            for f in files:
                w.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=f,
                    )
                )
                collector.add_file(f, schema, spec)
        manifests.append(w.to_manifest_file())

    if parent is not None:
        for manifest in parent.manifests(io):
            if not (manifest.has_added_files() or manifest.has_existing_files()):
                continue
            if not remove_all:
                manifests.append(manifest)
                continue
            entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
            if not entries:
                continue
            with writer(manifest.content) as w:
                for entry in entries:
                    w.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.DELETED,
                            snapshot_id=snapshot_id,
                            sequence_number=entry.sequence_number,
                            file_sequence_number=entry.file_sequence_number,
                            data_file=entry.data_file,
                        )
                    )
                    collector.remove_file(entry.data_file, schema, spec)
            manifests.append(w.to_manifest_file())

    removes = remove_all and parent is not None
    if delete_files or removes:
        operation = Operation.OVERWRITE if data_files else Operation.DELETE
    else:
        operation = Operation.APPEND
    summary = update_snapshot_summaries(
        Summary(operation=operation, **collector.build(), **summary_properties),
        parent.summary if parent is not None else None,
    )

    list_path = provider.new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
    written.append(list_path)
    with write_manifest_list(
        format_version=2,
        output_file=io.new_output(list_path),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id if parent is not None else None,
        sequence_number=sequence_number,
        avro_compression=compression,  # type: ignore[arg-type]
    ) as manifest_list:
        manifest_list.add_manifests(manifests)

    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id if parent is not None else None,
        sequence_number=sequence_number,
        manifest_list=list_path,
        summary=summary,
        schema_id=metadata.current_schema_id,
    )
    updates: tuple[TableUpdate, ...] = (
        SetPropertiesUpdate(updates=dict(table_properties)),
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent is not None else None,
        ),
    )
    requirements: tuple[TableRequirement, ...] = (
        AssertRefSnapshotId(
            snapshot_id=parent.snapshot_id if parent is not None else None, ref=MAIN_BRANCH
        ),
    )
    return StagedRowDelta(snapshot_id, updates, requirements, written)


def is_position_delete(data_file: DataFile) -> bool:
    return bool(data_file.content == DataFileContent.POSITION_DELETES)
