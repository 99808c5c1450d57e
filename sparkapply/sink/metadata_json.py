"""A table's ``metadata.json``, written at every commit, with its snapshots' part kept.

A commit writes the table's whole metadata, every snapshot it keeps included (100 to
150 with the default retention, and those a kept cut names), and pyiceberg serializes
each snapshot again at each commit, its summary through a Python serializer: an
eighth of a steady stream's apply thread (py-spy at 30 tps, where every batch is a
few transactions on pgbench's four tables and the cuts table). A snapshot never
changes once it is in the metadata, so its JSON is kept, per table, while the snapshot
is; the rest is serialized by pyiceberg as it always is.

The file is what pyiceberg writes (``ToOutputFile.table_metadata``) but for the place
of ``snapshots`` among the keys, which no reader depends on: the same JSON values,
compressed by the same rule (by the file name), never over an existing file.
Format-version 1 metadata, whose snapshots pyiceberg writes without their sequence
number, is left to pyiceberg whole.
"""

from __future__ import annotations

import threading

from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.utils.config import Config

# Per table (by its UUID): each kept snapshot's JSON, with the object it was made from.
_Kept = dict[int, tuple[Snapshot, str]]


class MetadataJson:
    """Serializes tables' metadata, keeping each snapshot's JSON (thread-safe: the
    apply and maintenance commit from their own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, _Kept] = {}
        self._exclude_none: bool | None = None

    def dumps(self, metadata: TableMetadata) -> str:
        exclude_none = self._excludes_none()
        if metadata.format_version == 1 or not metadata.snapshots:
            return metadata.model_dump_json(exclude_none=exclude_none)
        head = metadata.model_dump_json(exclude_none=exclude_none, exclude={"snapshots"})
        table = str(metadata.table_uuid)
        with self._lock:
            known = self._kept.get(table, {})
        kept: _Kept = {}
        for snapshot in metadata.snapshots:
            entry = known.get(snapshot.snapshot_id)
            if entry is None or entry[0] is not snapshot:
                entry = (snapshot, snapshot.model_dump_json(exclude_none=exclude_none))
            kept[snapshot.snapshot_id] = entry
        with self._lock:
            self._kept[table] = kept
        snapshots = ",".join(json for _, json in kept.values())
        return f'{head[:-1]},"snapshots":[{snapshots}]}}'

    def write(self, metadata: TableMetadata, io: FileIO, location: str) -> None:
        """Write ``metadata`` to ``location`` as pyiceberg's catalogs do (a new file)."""
        data = self.dumps(metadata).encode("utf-8")
        data = Compressor.get_compressor(location).bytes_compressor()(data)
        with io.new_output(location).create(overwrite=False) as stream:
            stream.write(data)

    def _excludes_none(self) -> bool:
        # pyiceberg writes a missing current snapshot as -1 under this setting, read
        # from its configuration (environment, ~/.pyiceberg.yaml) once per process here.
        if self._exclude_none is None:
            self._exclude_none = not Config().get_bool("legacy-current-snapshot-id")
        return self._exclude_none


METADATA_JSON = MetadataJson()
