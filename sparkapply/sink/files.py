"""The table's data files as the executors see them, and removal of orphaned files.

Executors apply copy-on-write: they read the footers (and, when a key may be inside,
the rows) of the current data files, so what crosses to them is a list of small,
picklable :class:`DataFileInfo`. Delete files are the one thing they cannot see: a
table that another engine wrote with merge-on-read deletes would resurrect deleted
rows in every file sparkapply rewrites, so :func:`current_data_files` refuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import Table

from sparkapply.errors import SinkError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DataFileInfo:
    """One live data file of a table's current snapshot, as executors need it."""

    path: str
    """As recorded in the manifest (a URI such as ``file:///…`` or ``s3://…``);
    this exact string names the file in ``commit_files(removed=…)``."""
    record_count: int
    file_size_in_bytes: int


def current_snapshot_id(table: Table) -> int | None:
    """The snapshot the executors plan against; pass it to ``commit_files(base_snapshot_id=…)``."""
    return table.metadata.current_snapshot_id


def current_data_files(table: Table) -> list[DataFileInfo]:
    """The live data files of ``table``'s current snapshot (as loaded; no refresh).

    Raises :class:`SinkError` if the snapshot has delete files, which sparkapply's
    copy-on-write executors cannot apply.
    """
    return [
        DataFileInfo(f.file_path, f.record_count, f.file_size_in_bytes)
        for f in live_data_files(table).values()
    ]


def live_data_files(table: Table) -> dict[str, DataFile]:
    """``path → DataFile`` of the current snapshot (the manifests' own entries, whose
    statistics an overwrite needs to keep the snapshot summary's totals right)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return {}
    files: dict[str, DataFile] = {}
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            if manifest.has_added_files() or manifest.has_existing_files():
                raise SinkError(
                    "table has row-level delete files, which sparkapply cannot apply",
                    table=".".join(table.name()),
                    hint="another engine wrote merge-on-read deletes; rewrite the table's data "
                    "files with that engine (rewrite_data_files with delete-file-threshold=1) "
                    "and set write.delete.mode / write.update.mode / write.merge.mode to "
                    "copy-on-write",
                )
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.DATA:
                files[entry.data_file.file_path] = entry.data_file
    return files


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
    live = live_data_files(table)
    removed: list[str] = []
    for path in wanted:
        if path in live:
            logger.warning("not removing %s: the table references it", path)
            continue
        try:
            table.io.delete(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot remove orphaned data file %s: %s", path, exc)
            continue
        removed.append(path)
    return removed
