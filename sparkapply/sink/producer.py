"""The snapshot producer: one Iceberg snapshot written from pyiceberg's manifest classes.

pyiceberg 0.12 produces appends and overwrites of data files only. sparkapply needs two
snapshots it cannot write: the row delta (data files and position-delete files, or a
TRUNCATE: ``rowdelta.py``) and the replace (compaction and manifest merge:
``rewrite.py``). Like pyiceberg's own ``_SnapshotProducer`` and its subclasses, they
share every step but two, which is all a subclass says: which manifests the snapshot
lists (:meth:`SnapshotProducer._manifests`) and its operation. Remove these producers
when pyiceberg gains row deltas and RewriteFiles (apache/iceberg-python PR 4002).

THE STEPS

1. From the table's metadata as loaded: the parent (the head of ``main``), a new
   snapshot id, the next sequence number, the default spec and the current schema.
2. The subclass's manifests, each written by :meth:`SnapshotProducer._write_manifest`:
   new files as ADDED (their data and file sequence numbers inherited from this
   snapshot), the parent's entries as DELETED or EXISTING (both keeping their own
   sequence numbers, so every position delete applies to exactly the data files it
   applied to before), the summary collector fed as they are written. A delete
   manifest declares content ``deletes`` (:class:`DeleteManifestWriter`). The writers
   are pyiceberg's, with their Avro writers kept (``avro_writes.py``).
3. The summary: pyiceberg's collector (added/removed files, records, position
   deletes), then the subclass's properties (``sparkapply.lsn``), with totals carried
   from the parent's summary.
4. The manifest list, the :class:`Snapshot`, and the metadata updates that commit it:
   optional table properties, the snapshot, ``main`` moved to it, and the one
   requirement ``AssertRefSnapshotId(main = parent)``: the commit lands on exactly the
   snapshot planned against or not at all. There is no rebase: the positions a row
   delta names, and the entries a replace rewrites, are those of the parent.

Nothing is committed here (:meth:`SnapshotProducer.stage` returns a
:class:`StagedChange`): the caller commits it alone (``commit.py``, ``rewrite.py``) or
with the batch's other tables (``atomic.py``). Every file written is listed in
:attr:`StagedChange.written` (and :attr:`SnapshotProducer.written` while writing), so
a change that does not land leaves nothing the caller cannot remove.
"""

# pyiceberg's pydantic models accept field names at runtime; without the pydantic mypy
# plugin mypy only knows their aliases ("snapshot-id").
# mypy: disable-error-code="call-arg"

from __future__ import annotations

import abc
import struct
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, cast

from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
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
from sparkapply.sink.avro_writes import (
    DataManifestWriter,
    DeleteManifestWriter,
    ManifestListWriterV2Kept,
)
from sparkapply.sink.manifest_reads import READS

_LONG = struct.Struct("<q")


@dataclass(slots=True)
class StagedChange:
    """The metadata updates and requirements that commit one change of a table (a
    snapshot, or a tag: ``cuts.py``), not yet sent to the catalog."""

    snapshot_id: int
    updates: tuple[TableUpdate, ...]
    requirements: tuple[TableRequirement, ...]
    written: list[str]  # manifests and the manifest list (orphans if the commit fails)


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


def _removes_all(_data_file: DataFile) -> bool:
    return True


class SnapshotProducer(abc.ABC):
    """One snapshot of ``table`` on its current snapshot; see the module doc."""

    manifest_prefix: ClassVar[str]
    """Manifest file names are ``<commit uuid>-<prefix><n>.avro``."""

    def __init__(self, table: Table, summary_properties: Mapping[str, str]) -> None:
        metadata = table.metadata
        self.io = table.io
        self.parent = table.current_snapshot()
        self.snapshot_id = metadata.new_snapshot_id()
        self.sequence_number = metadata.next_sequence_number()
        self.spec, self.schema = metadata.spec(), metadata.schema()
        self.schema_id = metadata.current_schema_id
        self.compression = cast(
            AvroCompressionCodec,
            metadata.properties.get(
                TableProperties.WRITE_AVRO_COMPRESSION,
                TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT,
            ),
        )
        self.summary_properties = dict(summary_properties)
        self.written: list[str] = []
        self.removed: Counter[ManifestContent] = Counter()  # entries written as DELETED
        self._collector = SnapshotSummaryCollector()
        self._provider = table.location_provider()
        self._commit_uuid = uuid.uuid4()

    @property
    @abc.abstractmethod
    def operation(self) -> Operation:
        """The snapshot summary's operation."""

    @abc.abstractmethod
    def _manifests(self) -> list[ManifestFile]:
        """Every manifest the snapshot lists (written with :meth:`_write_manifest`, or
        the parent's, carried forward unchanged)."""

    @property
    def parent_id(self) -> int | None:
        return self.parent.snapshot_id if self.parent is not None else None

    def parent_manifests(self) -> Iterator[ManifestFile]:
        """The parent's manifests that hold live entries (ADDED or EXISTING)."""
        if self.parent is None:
            return
        for manifest in READS.manifests(self.parent, self.io):
            if manifest.has_added_files() or manifest.has_existing_files():
                yield manifest

    def stage(self, table_properties: Mapping[str, str] | None = None) -> StagedChange:
        """Write the manifests and the manifest list; return the updates that commit the
        snapshot (and set ``table_properties`` in the same commit), not yet committed."""
        manifests = self._manifests()
        summary = self._summary()
        list_path = self._new_path(f"snap-{self.snapshot_id}-0-{self._commit_uuid}.avro")
        with ManifestListWriterV2Kept(
            output_file=self.io.new_output(list_path),
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=self.parent_id,
            sequence_number=self.sequence_number,
            compression=self.compression,
        ) as manifest_list:
            manifest_list.add_manifests(manifests)
        READS.wrote_list(list_path, tuple(manifest_list.prepare_manifest(m) for m in manifests))
        snapshot = Snapshot(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=self.parent_id,
            sequence_number=self.sequence_number,
            manifest_list=list_path,
            summary=summary,
            schema_id=self.schema_id,
        )
        updates: tuple[TableUpdate, ...] = (
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(
                ref_name=MAIN_BRANCH,
                type=SnapshotRefType.BRANCH,
                snapshot_id=self.snapshot_id,
                parent_snapshot_id=self.parent_id,
            ),
        )
        if table_properties is not None:
            updates = (SetPropertiesUpdate(updates=dict(table_properties)), *updates)
        requirements = (AssertRefSnapshotId(snapshot_id=self.parent_id, ref=MAIN_BRANCH),)
        return StagedChange(self.snapshot_id, updates, requirements, self.written)

    def _write_manifest(
        self,
        content: ManifestContent,
        added: Sequence[DataFile] = (),
        carried: Iterable[ManifestEntry] = (),
        removes: Callable[[DataFile], bool] = _removes_all,
    ) -> ManifestFile:
        """One manifest of ``content``: ``added`` files as ADDED, then the parent's
        ``carried`` entries as DELETED where ``removes`` says so, else as EXISTING."""
        path = self._new_path(f"{self._commit_uuid}-{self.manifest_prefix}{len(self.written)}.avro")
        cls = DeleteManifestWriter if content == ManifestContent.DELETES else DataManifestWriter
        writer: ManifestWriter = cls(
            self.spec, self.schema, self.io.new_output(path), self.snapshot_id, self.compression
        )
        with writer:
            for data_file in added:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self.snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=data_file,
                    )
                )
                self._collector.add_file(data_file, self.schema, self.spec)
            for entry in carried:
                if removes(entry.data_file):
                    writer.delete(entry)
                    self._collector.remove_file(entry.data_file, self.schema, self.spec)
                    self.removed[content] += 1
                else:
                    writer.existing(entry)
        return writer.to_manifest_file()

    def _summary(self) -> Summary:
        # pyiceberg totals only append/overwrite/delete: a replace is totalled as an
        # overwrite (the same totals), then says what it is.
        operation = self.operation
        totalled = Operation.OVERWRITE if operation == Operation.REPLACE else operation
        summary = update_snapshot_summaries(
            Summary(totalled, **self._collector.build(), **self.summary_properties),
            self.parent.summary if self.parent is not None else None,
        )
        if totalled == operation:
            return summary
        return Summary(operation, **summary.additional_properties)

    def _new_path(self, name: str) -> str:
        path = self._provider.new_metadata_location(name)
        self.written.append(path)
        return path
