"""What expiry and rewrites read of manifest lists and manifests, kept in this process.

Expiry (``maintenance.py``) reads the manifest list of every snapshot it expires and
of every snapshot it keeps, and the entries of every manifest they list, to know which
files only the expired ones referenced. Run after run, most of those are the same
files: the snapshots kept last time are this time's expired or kept ones. A manifest
list or manifest is never rewritten (a new snapshot writes new ones under new names),
so what a read returned stays true for as long as anyone asks, and is kept by path.
Bounded (least recently used first out): a run reads again what no longer fits.

A manifest list this process wrote is kept as written (:meth:`ManifestReads.wrote_list`,
the manifests as the list's writer recorded them): the next batch's snapshot lists its
parent's manifests, the listing of live files and maintenance's health read them, and
reading back the list just written was a sixth of staging a table's snapshot.

Reads go through ``avro_reads.py``: pyiceberg's reads, with each file schema's Avro
reader built once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table.snapshots import Snapshot

from sparkapply.sink.avro_reads import manifest_entries, manifest_list

Entry = tuple[str, int, bool]
"""A file a manifest names: its path, size in bytes, and whether the entry is live
(ADDED or EXISTING, not DELETED)."""

_V = TypeVar("_V")

MAX_LISTS = 4096  # manifest lists: a tuple of pyiceberg's shared ManifestFile objects
MAX_ENTRIES = 500_000  # entries over all kept manifests (~100 bytes each)
# pyiceberg's ManifestEntry objects (a DataFile with its bounds: ~1-2 kB each); the
# manifests current snapshots list are held by the listings anyway (files.py).
MAX_LIVE_ENTRIES = 100_000


class _Kept(Generic[_V]):
    """Lists kept by path, at most ``limit`` items over all of them (least recently
    used out first); a list over a quarter of the limit is not kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.by_path: OrderedDict[str, list[_V]] = OrderedDict()
        self.count = 0

    def keep(self, path: str, values: list[_V]) -> None:
        if len(values) > self.limit // 4 or path in self.by_path:
            return
        self.by_path[path] = values
        self.count += len(values)
        while self.count > self.limit:
            _, old = self.by_path.popitem(last=False)
            self.count -= len(old)


class ManifestReads:
    def __init__(
        self,
        max_lists: int = MAX_LISTS,
        max_entries: int = MAX_ENTRIES,
        max_live_entries: int = MAX_LIVE_ENTRIES,
    ) -> None:
        self.max_lists = max_lists
        self._lists: OrderedDict[str, tuple[ManifestFile, ...]] = OrderedDict()
        self._entries: _Kept[Entry] = _Kept(max_entries)
        self._live: _Kept[ManifestEntry] = _Kept(max_live_entries)
        self._lock = threading.Lock()  # expiry runs beside the apply and on it
        self.reads = 0  # files read (for tests)

    def manifests(self, snapshot: Snapshot, io: FileIO) -> tuple[ManifestFile, ...]:
        """The manifests ``snapshot``'s manifest list names."""
        path = snapshot.manifest_list
        found = _kept(self._lists, path, self._lock)
        if found is not None:
            return found
        manifests = manifest_list(path, io)
        with self._lock:
            self.reads += 1
        self.wrote_list(path, manifests)
        return manifests

    def wrote_list(self, path: str, manifests: tuple[ManifestFile, ...]) -> None:
        """Keep the manifest list this process wrote at ``path``: ``manifests`` as its
        writer recorded them (sequence numbers assigned), what a read would return."""
        with self._lock:
            self._lists[path] = manifests
            while len(self._lists) > self.max_lists:
                self._lists.popitem(last=False)

    def entries(self, manifest: ManifestFile, io: FileIO) -> list[Entry]:
        """Every file ``manifest``'s entries name, DELETED ones included."""
        path = manifest.manifest_path
        found = _kept(self._entries.by_path, path, self._lock)
        if found is not None:
            return found
        entries = [
            (
                e.data_file.file_path,
                e.data_file.file_size_in_bytes,
                e.status != ManifestEntryStatus.DELETED,
            )
            for e in manifest_entries(manifest, io, discard_deleted=False)
        ]
        with self._lock:
            self.reads += 1
            self._entries.keep(path, entries)
        return entries

    def live_entries(self, manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
        """``manifest``'s ADDED and EXISTING entries as pyiceberg reads them (a
        rewrite carries them into its own manifests; not to be changed: kept)."""
        path = manifest.manifest_path
        found = _kept(self._live.by_path, path, self._lock)
        if found is not None:
            return found
        entries = manifest_entries(manifest, io, discard_deleted=True)
        with self._lock:
            self.reads += 1
            self._live.keep(path, entries)
        return entries


def _kept(kept: OrderedDict[str, _V], path: str, lock: threading.Lock) -> _V | None:
    """What was read of ``path`` before (now the most recently used), or None."""
    with lock:
        found = kept.get(path)
        if found is not None:
            kept.move_to_end(path)
        return found


READS = ManifestReads()
"""The process's reads: every table's, by path (paths are unique across tables)."""
