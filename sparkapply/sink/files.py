"""The table's live files as the executors see them, and removal of orphaned files.

Executors locate the rows a batch replaces by reading the key columns of the live data
files, minus the positions the live position-delete files already delete, so what
crosses to them is a list of small, picklable :class:`DataFileInfo` (with the key
column's bounds, to skip files that cannot hold a key) and :class:`DeleteFileInfo`.
Equality deletes (written by other engines) are the one thing they cannot apply, so
:func:`live_files` refuses a table that has them.

THE LISTING CACHE
    Listing a snapshot's live files reads every manifest it lists; a table that takes
    a commit per batch gains one or two manifests a batch until maintenance merges
    them, so a fresh listing per batch costs more and more. :class:`LiveFileCache`
    keeps each manifest's live entries by the manifest's path. A manifest file is never
    changed once written (a new snapshot writes new manifests and lists the unchanged
    ones again by path), so an entry kept by path is right for as long as any snapshot
    lists it, whoever wrote the snapshot: after our own row delta, one or two manifests
    are new; after a compaction or a manifest merge by maintenance or another engine,
    the ones it wrote. There is nothing to invalidate, only manifests no longer listed
    to drop; a restart starts empty and reads each manifest once. The entries
    themselves come from the process's manifest reads (``manifest_reads.py``), so the
    apply, maintenance's plan and a rewrite's commit parse a manifest once between
    them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyiceberg.conversions import from_bytes
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestFile
from pyiceberg.table import Table
from pyiceberg.types import PrimitiveType

from sparkapply.datafiles import FILE_PATH_FIELD_ID, POS_FIELD_ID, DataFileInfo, DeleteFileInfo
from sparkapply.errors import SinkError
from sparkapply.sink.manifest_reads import READS

logger = logging.getLogger(__name__)


KeyField = tuple[int, PrimitiveType]
"""The key column's field id and type: which bounds a :class:`DataFileInfo` carries."""


@dataclass(slots=True)
class LiveFiles:
    """The current snapshot's live data files and position-delete files."""

    data: dict[str, DataFile] = field(default_factory=dict)
    deletes: list[DataFile] = field(default_factory=list)


def current_snapshot_id(table: Table) -> int | None:
    """The snapshot the executors plan against; pass it to ``commit_files(base_snapshot_id=…)``."""
    return table.metadata.current_snapshot_id


def current_data_files(table: Table, key_column: str | None = None) -> list[DataFileInfo]:
    """The live data files of ``table``'s current snapshot (as loaded; no refresh),
    with the bounds of ``key_column`` when given and recorded."""
    return data_file_infos(table, live_files(table), key_column)


def data_file_infos(
    table: Table, live: LiveFiles, key_column: str | None = None
) -> list[DataFileInfo]:
    key = _key_field(table, key_column)
    return [_data_info(f, key) for f in live.data.values()]


def _key_field(table: Table, key_column: str | None) -> KeyField | None:
    if key_column is None:
        return None
    key_field = table.schema().find_field(key_column)
    if not isinstance(key_field.field_type, PrimitiveType):
        return None
    return key_field.field_id, key_field.field_type


def _data_info(f: DataFile, key: KeyField | None) -> DataFileInfo:
    lower = upper = None
    if key is not None:
        field_id, key_type = key
        lo = (f.lower_bounds or {}).get(field_id)
        hi = (f.upper_bounds or {}).get(field_id)
        if lo is not None and hi is not None:
            lower, upper = from_bytes(key_type, lo), from_bytes(key_type, hi)
    return DataFileInfo(f.file_path, f.record_count, f.file_size_in_bytes, lower, upper)


def delete_file_infos(live: LiveFiles) -> list[DeleteFileInfo]:
    return [_delete_info(f) for f in live.deletes]


def _delete_info(f: DataFile) -> DeleteFileInfo:
    lo = (f.lower_bounds or {}).get(FILE_PATH_FIELD_ID)
    hi = (f.upper_bounds or {}).get(FILE_PATH_FIELD_ID)
    lo_pos = (f.lower_bounds or {}).get(POS_FIELD_ID)
    hi_pos = (f.upper_bounds or {}).get(POS_FIELD_ID)
    return DeleteFileInfo(
        f.file_path,
        f.record_count,
        f.file_size_in_bytes,
        lo.decode() if lo is not None else "",
        # No bounds: the file may name any path.
        hi.decode() if hi is not None else "\U0010ffff",
        int.from_bytes(lo_pos, "little", signed=True) if lo_pos else 0,
        int.from_bytes(hi_pos, "little", signed=True) if hi_pos else 2**62,
    )


def live_data_files(table: Table) -> dict[str, DataFile]:
    """``path → DataFile`` of the current snapshot (the manifests' own entries, whose
    statistics an overwrite needs to keep the snapshot summary's totals right)."""
    return live_files(table).data


def live_files(table: Table) -> LiveFiles:
    """The current snapshot's live data and position-delete files.

    Raises :class:`SinkError` if the snapshot has equality-delete files, which
    sparkapply's executors cannot apply.
    """
    live = LiveFiles()
    snapshot = table.current_snapshot()
    if snapshot is None:
        return live
    for manifest in READS.manifests(snapshot, table.io):
        if manifest.has_added_files() or manifest.has_existing_files():
            _read_manifest(table, manifest).add_to(live)
    return live


@dataclass(slots=True)
class _ManifestFiles:
    """One manifest's live entries, and what the executors need of them (built once)."""

    data: list[DataFile]
    deletes: list[DataFile]
    # DataFileInfos by the key column they carry the bounds of (field id and type).
    infos: dict[KeyField | None, list[DataFileInfo]] = field(default_factory=dict)
    delete_infos: list[DeleteFileInfo] | None = None

    def add_to(self, live: LiveFiles) -> None:
        for f in self.data:
            live.data[f.file_path] = f
        live.deletes += self.deletes


def _read_manifest(table: Table, manifest: ManifestFile) -> _ManifestFiles:
    files = _ManifestFiles([], [])
    for entry in READS.live_entries(manifest, table.io):
        f = entry.data_file
        if f.content == DataFileContent.DATA:
            files.data.append(f)
        elif f.content == DataFileContent.POSITION_DELETES:
            files.deletes.append(f)
        else:
            raise SinkError(
                "table has equality-delete files, which sparkapply cannot apply",
                table=".".join(table.name()),
                hint="another engine wrote equality deletes; rewrite the table's data "
                "files with that engine (rewrite_data_files with delete-file-threshold=1)",
            )
    return files


class LiveFileCache:
    """The live files of tables' current snapshots, each manifest read once (see THE
    LISTING CACHE). Equal to :func:`live_files`, :func:`data_file_infos` and
    :func:`delete_file_infos` of a fresh listing; not thread-safe (the apply thread)."""

    def __init__(self) -> None:
        # Per table (by its UUID): the live entries of the manifests its current
        # snapshot listed when last asked, by manifest path.
        self._tables: dict[str, dict[str, _ManifestFiles]] = {}
        self.manifests_read = 0  # for tests and logs

    def _manifests(self, table: Table) -> list[_ManifestFiles]:
        key = str(table.metadata.table_uuid)
        snapshot = table.current_snapshot()
        if snapshot is None:
            self._tables.pop(key, None)
            return []
        known = self._tables.get(key, {})
        listed: dict[str, _ManifestFiles] = {}
        for manifest in READS.manifests(snapshot, table.io):
            if not (manifest.has_added_files() or manifest.has_existing_files()):
                continue
            path = manifest.manifest_path
            files = known.get(path)
            if files is None:
                files = _read_manifest(table, manifest)
                self.manifests_read += 1
            listed[path] = files
        self._tables[key] = listed  # manifests no longer listed are dropped
        return list(listed.values())

    def live_files(self, table: Table) -> LiveFiles:
        live = LiveFiles()
        for files in self._manifests(table):
            files.add_to(live)
        return live

    def listing(
        self, table: Table, key_column: str | None = None
    ) -> tuple[list[DataFileInfo], list[DeleteFileInfo]]:
        """What :func:`data_file_infos` and :func:`delete_file_infos` give for a
        fresh listing of ``table``'s current snapshot."""
        key = _key_field(table, key_column)
        data: dict[str, DataFileInfo] = {}
        deletes: list[DeleteFileInfo] = []
        for files in self._manifests(table):
            infos = files.infos.get(key)
            if infos is None:
                infos = files.infos[key] = [_data_info(f, key) for f in files.data]
            for info in infos:
                data[info.path] = info
            if files.delete_infos is None:
                files.delete_infos = [_delete_info(f) for f in files.deletes]
            deletes += files.delete_infos
        return list(data.values()), deletes

    def forget(self, table: Table) -> None:
        self._tables.pop(str(table.metadata.table_uuid), None)


def remove_orphans(table: Table, paths: Iterable[str]) -> list[str]:
    """Delete data files that a failed commit left unreferenced; return those deleted.

    For the files a commit tried to add after it failed with
    ``CommitConflictError`` or a :class:`SinkError` raised before the catalog was
    asked. The table is refreshed first and any path its current snapshot references
    is kept (with a warning), so calling this after an outcome that turned out to be
    a success cannot damage the table. Missing files count as removed. Other
    failures to delete are logged, not raised: an orphan wastes space, it is never
    read.
    """
    wanted = list(dict.fromkeys(paths))
    if not wanted:
        return []
    try:
        table.refresh()
    except Exception as exc:
        raise SinkError(
            f"cannot refresh the table to check which files are orphans: {exc}",
            table=".".join(table.name()),
            hint="nothing was deleted; the files can be removed later by an orphan-file sweep",
        ) from exc
    live_now = live_files(table)
    live = {*live_now.data, *(f.file_path for f in live_now.deletes)}
    for path in wanted:
        if path in live:
            logger.warning("not removing %s: the table references it", path)
    return delete_paths(table.io, [p for p in wanted if p not in live])


def delete_paths(io: FileIO, paths: Iterable[str]) -> list[str]:
    """Delete ``paths`` through ``io``: the one way the sink deletes files. Returns
    those gone (a file already missing counts). A failure is logged, not raised: a
    leftover file wastes space, and nothing references it, so it is never read."""
    gone: list[str] = []
    for path in paths:
        try:
            io.delete(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot delete %s: %s", path, exc)
            continue
        gone.append(path)
    return gone
