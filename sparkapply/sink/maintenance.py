"""Snapshot expiry that frees storage, and the orphan sweep.

A commit costs time proportional to the number of snapshots the table keeps (pyiceberg
deep-copies the whole table metadata a dozen times per commit; the metadata file
written per commit lists every snapshot). On a 2-core machine a 1-file commit takes
~20 ms on a new table and ~0.6 s after 300 snapshots, so a subscriber committing
every second must expire snapshots regularly, as every streaming Iceberg writer does.

WHAT EXPIRY DELETES

:func:`expire_snapshots` only removes snapshots from the metadata (the apply's cheap
bound on metadata size). :func:`expire_and_delete` also deletes the files that only the
expired snapshots referenced, in this order:

1. Before the commit, collect every file the doomed snapshots reference: manifest
   lists, manifests, and the data and delete files of every entry (any status).
2. One metadata commit removes the snapshots (pyiceberg's expiry; branch and tag
   heads are never expired).
3. From the metadata as committed, collect what the retained snapshots reference:
   manifest lists, manifests, and the files of live entries (ADDED, EXISTING). A file
   only a DELETED entry names is not read by any retained snapshot.
4. Delete (1) minus (3), then old metadata JSON files (:func:`old_metadata_files`).

OLD METADATA FILES

Iceberg's table properties say what happens to them: every commit keeps the newest
``write.metadata.previous-versions-max`` in the table's metadata log, and with
``write.metadata.delete-after-commit.enabled`` the files that leave the log are
deleted. Here they are deleted at expiry, on maintenance's thread, not after each
commit on the apply's (a storage round trip per table per batch before its
acknowledgement): the metadata files not in the log and older than its oldest entry.
A table that does not set the property is treated as sparkapply creates its tables
(``sink/tables.py``: on); one that sets it off keeps them for the orphan sweep. No
file a retained snapshot reads is among them: the current metadata lists every
retained snapshot.

A crash between 2 and 4 leaves files no snapshot references: the orphan sweep deletes
them once they are older than its grace period. Files a concurrent writer is adding are
never in (1), so expiry cannot delete them.

THE ORPHAN SWEEP

:func:`sweep_orphans` lists everything under the table's location and deletes data,
delete, manifest and metadata files that no snapshot of the current metadata (live
entries, manifests, manifest lists), no metadata-log entry and no statistics file
references, and that are older than the grace period: leftovers of crashed writes and
of expiries that did not finish. The grace period is what protects a commit in flight
(its files exist before the catalog points at them): it must exceed the longest
write-to-commit time of every writer of the table (24 h by default). Only files named
like Iceberg's (``.parquet``, ``.avro``, ``.orc``, ``.puffin``, ``.metadata.json``) are
ever deleted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pyarrow.fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import RemoveSnapshotsUpdate
from pyiceberg.utils.properties import property_as_bool

from sparkapply.errors import SinkArgumentError, SinkError
from sparkapply.failpoints import failpoint
from sparkapply.sink.files import delete_paths
from sparkapply.sink.manifest_reads import READS, Entry
from sparkapply.sink.tables import table_name
from sparkapply.storage import Storage, current

logger = logging.getLogger(__name__)

_DELETABLE = (".parquet", ".avro", ".orc", ".puffin", ".metadata.json")
# Iceberg's names: 00042-<uuid>.metadata.json, or v42.metadata.json (Hadoop tables).
_METADATA_VERSION = re.compile(r"^(?:(\d+)-.*|v(\d+))\.metadata\.json$")


def expire_snapshots(
    table: Table, *, older_than: dt.datetime, retain_last: int = 1, keep: Collection[int] = ()
) -> int:
    """Expire the snapshots older than ``older_than`` (aware datetime) but keep at
    least the ``retain_last`` newest and every branch or tag head; return how many
    were expired. One metadata commit; a concurrent commit makes it a
    :class:`SinkError` that can simply be retried later. Files stay on storage (see
    :func:`expire_and_delete`)."""
    doomed = _doomed(table, older_than, retain_last, keep)
    if not doomed:
        return 0
    before = len(table.metadata.snapshots)
    _commit_expiry(table, doomed)
    expired = before - len(table.metadata.snapshots)
    logger.info("expired %d snapshots of %s", expired, table_name(table))
    return expired


def _doomed(
    table: Table, older_than: dt.datetime, retain_last: int, keep: Collection[int]
) -> list[int]:
    try:
        return doomed_snapshots(
            table.metadata, older_than=older_than, retain_last=retain_last, keep=keep
        )
    except SinkArgumentError as exc:
        raise exc.with_context(table=table_name(table)) from None


def doomed_snapshots(
    metadata: TableMetadata,
    *,
    older_than: dt.datetime,
    retain_last: int,
    keep: Collection[int] = (),
) -> list[int]:
    """The snapshots to expire: older than ``older_than``, not among the
    ``retain_last`` newest, not a branch or tag head, not in ``keep`` (the snapshots
    kept cuts name: ``cuts.py``)."""
    if older_than.tzinfo is None:
        raise SinkArgumentError("older_than must be timezone-aware")
    if retain_last < 1:
        raise SinkArgumentError("retain_last must be at least 1")
    snapshots = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
    cutoff_ms = int(older_than.timestamp() * 1000)
    heads = {ref.snapshot_id for ref in metadata.refs.values()}
    candidates = snapshots[:-retain_last] if len(snapshots) > retain_last else []
    return [
        s.snapshot_id
        for s in candidates
        if s.timestamp_ms < cutoff_ms and s.snapshot_id not in heads and s.snapshot_id not in keep
    ]


def _commit_expiry(table: Table, doomed: list[int]) -> None:
    """One metadata commit that removes ``doomed`` (those still there and still no
    branch or tag head, as the table now is); ``table`` then holds what committed.

    Not pyiceberg's ``expire_snapshots().by_ids(...)``: it derives the transaction's
    whole table metadata again (a deep copy) twice for every id it is given, 1.6 s for
    60 of 160 snapshots on this machine, and this commit runs under the table's lock,
    which the apply waits for (``locks.py``).
    """
    metadata = table.metadata
    heads = {ref.snapshot_id for ref in metadata.refs.values()}
    ids = [i for i in doomed if i not in heads and metadata.snapshot_by_id(i) is not None]
    if not ids:
        return
    with _failing(
        table,
        "cannot expire snapshots: {kind}: {exc}",
        "expiry is maintenance; it can be retried at the next interval",
    ):
        # pyiceberg's models take field names at runtime; mypy knows only the aliases.
        update = RemoveSnapshotsUpdate(snapshot_ids=ids)  # type: ignore[call-arg]
        response = table.catalog.commit_table(table, (), (update,))
    table.metadata = response.metadata
    table.metadata_location = response.metadata_location


@contextlib.contextmanager
def _failing(table: Table, message: str, hint: str) -> Iterator[None]:
    """Any failure inside as a :class:`SinkError` naming the table; ``message`` is
    formatted with the exception (``exc``) and its class name (``kind``)."""
    try:
        yield
    except Exception as exc:
        raise SinkError(
            message.format(kind=type(exc).__name__, exc=exc), table=table_name(table), hint=hint
        ) from exc


@dataclass(slots=True)
class Deletions:
    """What expiry or the sweep deleted (or, dry run, would delete)."""

    bytes_deleted: int = 0
    deleted: list[str] = field(default_factory=list)

    def remove(self, io: FileIO, path: str, size: int, *, dry_run: bool) -> bool:
        """Delete ``path`` (not on a dry run) and record it; False if it is still there."""
        if not dry_run and not delete_paths(io, [path]):
            return False
        self.bytes_deleted += size
        self.deleted.append(path)
        return True


@dataclass(slots=True)
class ExpiryOutcome(Deletions):
    snapshots_expired: int = 0
    files_deleted: int = 0
    metadata_files_deleted: int = 0


def expire_and_delete(
    table: Table,
    *,
    older_than: dt.datetime,
    retain_last: int,
    dry_run: bool = False,
    keep: Collection[int] = (),
    guard: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
) -> ExpiryOutcome:
    """Expire snapshots as :func:`expire_snapshots` does and delete the files only they
    referenced (see the module doc). ``dry_run``: commit and delete nothing; report
    what would be. ``guard`` is held around the one metadata commit only (beside the
    apply: ``sink/locks.py``); reading manifests and deleting files run outside it,
    on the table as refreshed under it."""
    outcome = ExpiryOutcome()
    metadata = table.metadata
    doomed = _doomed(table, older_than, retain_last, keep)
    io = table.io
    if doomed:
        candidates: dict[str, int] = {}
        for path, size, _live in _referenced(metadata, io, doomed):
            candidates[path] = size
        if dry_run:
            kept_ids = [s.snapshot_id for s in metadata.snapshots if s.snapshot_id not in doomed]
        else:
            with guard():
                if guard is not contextlib.nullcontext:
                    table.refresh()  # another writer may have committed meanwhile
                before = len(table.metadata.snapshots)
                _commit_expiry(table, doomed)
            outcome.snapshots_expired = before - len(table.metadata.snapshots)
            failpoint("expire-before-delete")
            kept_ids = [s.snapshot_id for s in table.metadata.snapshots]
        if dry_run:
            outcome.snapshots_expired = len(doomed)
        still_used = {
            _key(path) for path, _size, live in _referenced(table.metadata, io, kept_ids) if live
        }
        for path, size in candidates.items():
            if _key(path) in still_used:
                continue
            if outcome.remove(io, path, size, dry_run=dry_run):
                outcome.files_deleted += 1
    for path, size in old_metadata_files(table):
        if outcome.remove(io, path, size, dry_run=dry_run):
            outcome.metadata_files_deleted += 1
    if outcome.snapshots_expired or outcome.deleted:
        logger.info(
            "%s %s: %d snapshots expired, %d files and %d metadata files (%d bytes) deleted",
            "would expire" if dry_run else "expired",
            table_name(table),
            outcome.snapshots_expired,
            outcome.files_deleted,
            outcome.metadata_files_deleted,
            outcome.bytes_deleted,
        )
    return outcome


def _referenced(
    metadata: TableMetadata, io: FileIO, snapshot_ids: Iterable[int]
) -> Iterator[Entry]:
    """(path, size, live) of every file the snapshots reference: their manifest lists
    and manifests (live), and the files their manifests' entries name (live unless the
    entry is DELETED). What was read before is not read again (``manifest_reads.py``)."""
    for snapshot_id in snapshot_ids:
        snapshot = metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            continue
        yield snapshot.manifest_list, 0, True
        for manifest in READS.manifests(snapshot, io):
            yield manifest.manifest_path, manifest.manifest_length, True
            yield from READS.entries(manifest, io)


def referenced_files(table: Table) -> set[str]:
    """Every file the current metadata references (normalised by :func:`_key`): the
    metadata files of the log, statistics files, and for every snapshot its manifest
    list, manifests and the files of live entries."""
    metadata = table.metadata
    keep = {
        _key(path)
        for path, _size, live in _referenced(
            metadata, table.io, [s.snapshot_id for s in metadata.snapshots]
        )
        if live
    }
    keep.add(_key(table.metadata_location))
    keep.update(_key(entry.metadata_file) for entry in metadata.metadata_log)
    for stats in [*metadata.statistics, *metadata.partition_statistics]:
        keep.add(_key(stats.statistics_path))
    return keep


def unreferenced(table: Table, paths: Iterable[str]) -> list[str]:
    """Those of ``paths`` that no snapshot of the table references (never committed,
    or only by snapshots already expired)."""
    keep = referenced_files(table)
    return [p for p in paths if _key(p) not in keep]


@dataclass(slots=True)
class OrphanOutcome(Deletions):
    files_deleted: int = 0
    too_young: int = 0  # unreferenced files inside the grace period, kept


def sweep_orphans(
    table: Table,
    *,
    older_than: dt.datetime,
    dry_run: bool = False,
    waiting: Collection[str] = (),
) -> OrphanOutcome:
    """Delete the files under the table's location that the current metadata does not
    reference and that were last modified before ``older_than``; see the module doc.
    ``waiting``: files no snapshot references yet that a commit still will, as name
    prefixes (a file's full name is one): staged for a prepared transaction, however
    long it waits for COMMIT PREPARED, or for a streamed one, however long it runs.

    The table is refreshed first, so that a commit that landed since it was loaded
    protects its files."""
    if older_than.tzinfo is None:
        raise SinkArgumentError("older_than must be timezone-aware")
    with _failing(
        table,
        "cannot refresh the table before the orphan sweep: {exc}",
        "nothing was deleted; the sweep runs again at the next interval",
    ):
        table.refresh()
    keep = referenced_files(table)
    kept_prefixes = tuple(_key(p) for p in waiting)
    outcome = OrphanOutcome()
    for path, size, mtime in list_files(table.location(), Storage.of(table.io.properties)):
        key = _key(path)
        if not path.endswith(_DELETABLE) or key in keep or key.startswith(kept_prefixes):
            continue
        if mtime >= older_than:
            outcome.too_young += 1
            continue
        if outcome.remove(table.io, path, size, dry_run=dry_run):
            outcome.files_deleted += 1
    if outcome.deleted:
        logger.info(
            "%s %d orphan files (%d bytes) of %s",
            "would remove" if dry_run else "removed",
            outcome.files_deleted,
            outcome.bytes_deleted,
            table_name(table),
        )
    return outcome


def list_files(
    location: str, storage: Storage | None = None
) -> Iterator[tuple[str, int, dt.datetime]]:
    """(URI, size, modification time) of every file under ``location`` (a listing by
    prefix on an object store), opened with ``storage`` (default: the settings in
    force)."""
    scheme = urlsplit(location).scheme
    try:
        fs, root = (storage or current()).filesystem(location)
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError as exc:
        raise SinkError(f"cannot list {location}: {exc}", hint="nothing was deleted") from exc
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        mtime = info.mtime or dt.datetime.now(dt.UTC)
        if mtime.tzinfo is None:
            mtime = mtime.replace(tzinfo=dt.UTC)
        uri = ("file://" + info.path) if scheme in ("", "file") else f"{scheme}://{info.path}"
        yield uri, int(info.size or 0), mtime


def old_metadata_files(table: Table) -> list[tuple[str, int]]:
    """(path, size) of the metadata JSON files older than the oldest one the metadata
    log keeps, unless the table keeps them (see OLD METADATA FILES)."""
    if not property_as_bool(
        table.properties, TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED, True
    ):
        return []
    logged = [entry.metadata_file for entry in table.metadata.metadata_log]
    versions = [v for v in (_version(p) for p in [*logged, table.metadata_location]) if v >= 0]
    if not versions:
        return []
    oldest = min(versions)
    keep = {_key(p) for p in [*logged, table.metadata_location]}
    directory = table.metadata_location.rsplit("/", 1)[0]
    stale = []
    for path, size, _mtime in list_files(directory, Storage.of(table.io.properties)):
        version = _version(path)
        if 0 <= version < oldest and _key(path) not in keep:
            stale.append((path, size))
    return stale


def _version(path: str) -> int:
    match = _METADATA_VERSION.match(path.rsplit("/", 1)[-1])
    return int(match.group(1) or match.group(2)) if match else -1


def _key(path: str) -> str:
    """One spelling per file: ``file:///a``, ``file:/a`` and ``/a`` are the same file."""
    parts = urlsplit(path)
    if parts.scheme in ("", "file"):
        return parts.path
    return f"{parts.scheme}://{parts.netloc}{parts.path}"
