"""What expiry reads of a table's manifest lists and manifests, kept in this process.

Expiry (``maintenance.py``) reads the manifest list of every snapshot it expires and
of every snapshot it keeps, and the entries of every manifest they list, to know which
files only the expired ones referenced. Run after run, most of those are the same
files: the snapshots kept last time are this time's expired or kept ones. A manifest
list or manifest is never rewritten (a new snapshot writes new ones under new names),
so what a read returned stays true for as long as anyone asks, and is kept by path.
Bounded (least recently used first out): a run reads again what no longer fits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TypeVar

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntryStatus, ManifestFile
from pyiceberg.table.snapshots import Snapshot

Entry = tuple[str, int, bool]
"""A file a manifest names: its path, size in bytes, and whether the entry is live
(ADDED or EXISTING, not DELETED)."""

_V = TypeVar("_V")

MAX_LISTS = 4096  # manifest lists: a tuple of pyiceberg's shared ManifestFile objects
MAX_ENTRIES = 500_000  # entries over all kept manifests (~100 bytes each)


class ManifestReads:
    def __init__(self, max_lists: int = MAX_LISTS, max_entries: int = MAX_ENTRIES) -> None:
        self.max_lists = max_lists
        self.max_entries = max_entries
        self._lists: OrderedDict[str, tuple[ManifestFile, ...]] = OrderedDict()
        self._entries: OrderedDict[str, list[Entry]] = OrderedDict()
        self._entry_count = 0
        self._lock = threading.Lock()  # expiry runs beside the apply and on it
        self.reads = 0  # files read (for tests)

    def manifests(self, snapshot: Snapshot, io: FileIO) -> tuple[ManifestFile, ...]:
        """The manifests ``snapshot``'s manifest list names."""
        path = snapshot.manifest_list
        found = _kept(self._lists, path, self._lock)
        if found is not None:
            return found
        manifests = tuple(snapshot.manifests(io))
        with self._lock:
            self.reads += 1
            self._lists[path] = manifests
            while len(self._lists) > self.max_lists:
                self._lists.popitem(last=False)
        return manifests

    def entries(self, manifest: ManifestFile, io: FileIO) -> list[Entry]:
        """Every file ``manifest``'s entries name, DELETED ones included."""
        path = manifest.manifest_path
        found = _kept(self._entries, path, self._lock)
        if found is not None:
            return found
        entries = [
            (
                e.data_file.file_path,
                e.data_file.file_size_in_bytes,
                e.status != ManifestEntryStatus.DELETED,
            )
            for e in manifest.fetch_manifest_entry(io, discard_deleted=False)
        ]
        with self._lock:
            self.reads += 1
            if len(entries) <= self.max_entries // 4 and path not in self._entries:
                self._entries[path] = entries
                self._entry_count += len(entries)
                while self._entry_count > self.max_entries:
                    _, old = self._entries.popitem(last=False)
                    self._entry_count -= len(old)
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
