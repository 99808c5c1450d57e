"""Row deltas: one snapshot that adds data files and position-delete files.

pyiceberg 0.12 writes neither delete files nor delete manifests, so merge-on-read needs
this small producer (on the base in ``producer.py``, built only from pyiceberg's
manifest, manifest-list and snapshot classes). It is the one place that knows how;
remove it when pyiceberg gains row deltas (apache/iceberg-python PR 4002) and call that
instead.

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

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from sparkapply.sink.manifest_reads import READS
from sparkapply.sink.producer import SnapshotProducer


class RowDelta(SnapshotProducer):
    """Adds ``data_files`` and ``delete_files`` (position deletes); with
    ``remove_all`` (a TRUNCATE) also removes every live file of the parent."""

    manifest_prefix = "m"

    def __init__(
        self,
        table: Table,
        *,
        data_files: Sequence[DataFile],
        delete_files: Sequence[DataFile],
        remove_all: bool,
        summary_properties: Mapping[str, str],
    ) -> None:
        super().__init__(table, summary_properties)
        self._data_files = data_files
        self._delete_files = delete_files
        self._remove_all = remove_all

    @property
    def operation(self) -> Operation:
        if self._delete_files or (self._remove_all and self.parent is not None):
            return Operation.OVERWRITE if self._data_files else Operation.DELETE
        return Operation.APPEND

    def _manifests(self) -> list[ManifestFile]:
        manifests = [
            self._write_manifest(content, added=files)
            for content, files in (
                (ManifestContent.DATA, self._data_files),
                (ManifestContent.DELETES, self._delete_files),
            )
            if files
        ]
        if not self._remove_all:
            return [*manifests, *self.parent_manifests()]
        # Every live entry of the parent as DELETED, in one manifest per content: one
        # per parent manifest was a manifest written per batch the table ever took
        # since its last merge (the cuts table's rewrite: 64 of them, half a second).
        removed: dict[ManifestContent, list[ManifestEntry]] = {}
        for manifest in self.parent_manifests():
            removed.setdefault(manifest.content, []).extend(READS.live_entries(manifest, self.io))
        return manifests + [
            self._write_manifest(content, carried=entries)
            for content, entries in removed.items()
            if entries
        ]
