"""What a table's maintenance should do: its health, and the compaction plan. Driver side.

HEALTH comes from the current snapshot's summary (totals of data files, delete files,
rows, position deletes, bytes) and its manifest list: no data file is read, so the run
loop can check every table after every batch.

THE COMPACTION PLAN

- A data file is rewritten when it is small (under 3/4 of the target size, as Iceberg's
  own ``rewrite_data_files`` decides) or when at least ``file_delete_ratio`` of its
  rows are deleted. How many rows a file has deleted comes from the ``file_path``
  column of the live delete files (small files; read once per plan).
- Those files are bin-packed by their live bytes (size x live share) into groups of at
  most the target size; one Spark task per group. Within a group, the largest file is
  left out while it is bigger than all the others together (size tiers: a 40 MB file
  is not rewritten to absorb 80 kB of new rows; the small files merge among
  themselves until their tier is as big). A group that is one file without deletes is
  not worth a rewrite and is dropped.
- A delete file that names only rewritten files (or files no longer live) no longer
  applies: it is removed. When two or more delete files still apply, they are merged
  into one (one more task), keeping only the positions of data files that stay live.

The plan names the snapshot it was made against; the commit lands on it, or on a later
one if what came between can be carried over (``rebase.py``).
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkapply.apply.write.file_cache import deleted_positions
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo
from sparkapply.sink.files import LiveFileCache, LiveFiles, data_file_infos, delete_file_infos
from sparkapply.sink.manifest_reads import READS

if TYPE_CHECKING:
    from pyiceberg.table import Table

SMALL_FILE_FRACTION = 0.75

# Maintenance's listings of live files, built from the manifests the process has
# already parsed (the apply parsed most of them): reading every manifest again was
# half of a hot table's compaction (0.19 of 0.40 s for 56 manifests).
_LISTINGS = LiveFileCache()
_LISTINGS_LOCK = threading.Lock()


def listing(table: Table) -> LiveFiles:
    """The live files of ``table``'s current snapshot (as ``sink.files.live_files``)."""
    with _LISTINGS_LOCK:
        return _LISTINGS.live_files(table)


@dataclass(frozen=True, slots=True)
class Health:
    """A table's file counts and sizes, from its current snapshot."""

    snapshots: int
    manifests: int
    data_files: int
    delete_files: int
    records: int  # rows in the data files, deleted ones included
    position_deletes: int
    data_bytes: int  # data and delete files of the current snapshot
    live_bytes_estimate: int  # data bytes x the share of rows not deleted

    @property
    def delete_ratio(self) -> float:
        return self.position_deletes / self.records if self.records else 0.0

    @property
    def files(self) -> int:
        return self.data_files + self.delete_files


def health(table: Table) -> Health:
    """The :class:`Health` of a table (read from its summary and manifest list)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return Health(len(table.metadata.snapshots), 0, 0, 0, 0, 0, 0, 0)
    s = snapshot.summary.additional_properties if snapshot.summary is not None else {}

    def total(key: str) -> int:
        return int(s.get(key, 0))

    records, deletes = total("total-records"), total("total-position-deletes")
    size = total("total-files-size")
    live_share = 1 - deletes / records if records else 1.0
    return Health(
        snapshots=len(table.metadata.snapshots),
        manifests=len(READS.manifests(snapshot, table.io)),
        data_files=total("total-data-files"),
        delete_files=total("total-delete-files"),
        records=records,
        position_deletes=deletes,
        data_bytes=size,
        live_bytes_estimate=int(size * max(live_share, 0.0)),
    )


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """What one compaction of a table does, against ``base_snapshot_id``."""

    base_snapshot_id: int
    groups: tuple[tuple[DataFileInfo, ...], ...]  # data files rewritten together, a task each
    delete_files: tuple[DeleteFileInfo, ...]  # every live delete file (tasks apply them)
    drop_deletes: tuple[str, ...]  # delete files that no longer apply once the groups land
    merge_deletes: tuple[DeleteFileInfo, ...]  # delete files merged into one
    keep_paths: frozenset[str] = field(default_factory=frozenset)  # data files that stay

    @property
    def rewritten(self) -> tuple[str, ...]:
        return tuple(f.path for g in self.groups for f in g)

    @property
    def removed(self) -> tuple[str, ...]:
        """Every file the commit removes."""
        return (*self.rewritten, *self.drop_deletes, *(d.path for d in self.merge_deletes))

    @property
    def input_bytes(self) -> int:
        """What the plan's tasks read: the rewritten data files, and every live delete
        file (each rewrite applies them all; the merge reads those it merges)."""
        return sum(f.file_size_in_bytes for g in self.groups for f in g) + sum(
            d.file_size_in_bytes for d in self.delete_files
        )

    @property
    def empty(self) -> bool:
        return not (self.groups or self.drop_deletes or self.merge_deletes)


def plan_compaction(
    table: Table, *, target_file_size: int, file_delete_ratio: float
) -> CompactionPlan | None:
    """The compaction of ``table``'s current snapshot (see the module doc); None if
    there is nothing worth doing."""
    base = table.metadata.current_snapshot_id
    if base is None:
        return None
    live = listing(table)
    data = data_file_infos(table, live)
    deletes = delete_file_infos(live)
    named = {d.path: _named_paths(d) for d in deletes}
    deleted_rows: Counter[str] = Counter()
    for counts in named.values():
        deleted_rows.update(counts)

    def live_bytes(f: DataFileInfo) -> int:
        if f.record_count <= 0:
            return 0
        share = max(f.record_count - deleted_rows[f.path], 0) / f.record_count
        return int(f.file_size_in_bytes * share)

    small = target_file_size * SMALL_FILE_FRACTION
    candidates = [
        f
        for f in data
        if f.file_size_in_bytes < small
        or (f.record_count and deleted_rows[f.path] / f.record_count >= file_delete_ratio)
    ]

    def worth_alone(f: DataFileInfo) -> bool:  # its deleted rows justify a rewrite
        return bool(f.record_count) and deleted_rows[f.path] / f.record_count >= file_delete_ratio

    groups = [_tiered(g, worth_alone) for g in _bin_pack(candidates, live_bytes, target_file_size)]
    groups = [g for g in groups if len(g) > 1 or (g and deleted_rows[g[0].path] > 0)]
    rewritten = {f.path for g in groups for f in g}
    keep = frozenset(f.path for f in data if f.path not in rewritten)
    drop = [d.path for d in deletes if not (set(named[d.path]) & keep)]
    still = [d for d in deletes if d.path not in drop]
    merge = still if len(still) > 1 else []
    plan = CompactionPlan(
        base_snapshot_id=base,
        groups=tuple(tuple(g) for g in groups),
        delete_files=tuple(deletes),
        drop_deletes=tuple(drop),
        merge_deletes=tuple(merge),
        keep_paths=keep,
    )
    return None if plan.empty else plan


def _named_paths(d: DeleteFileInfo) -> Counter[str]:
    """How many positions ``d`` names in each data file (not to be changed: kept)."""
    return _named_in(d.path)


# A delete file never changes: what it names is read once per process, not once per
# plan (a hot table's plan named the same 15-30 delete files run after run).
@functools.lru_cache(maxsize=8192)
def _named_in(path: str) -> Counter[str]:
    # The positions the apply's locate already grouped, when it read this file here.
    return Counter({p: len(positions) for p, positions in deleted_positions(path).items()})


def _tiered(
    group: list[DataFileInfo], worth_alone: Callable[[DataFileInfo], bool]
) -> list[DataFileInfo]:
    """The group without its largest files while each is bigger than the rest together
    (and not worth a rewrite for its deletes): a table smaller than the target keeps its
    big file while the small ones merge among themselves, tier by tier, so a row is
    rewritten a logarithmic number of times, not at every compaction."""
    members = sorted(group, key=lambda f: -f.file_size_in_bytes)
    while len(members) > 1 and not worth_alone(members[0]):
        rest = sum(f.file_size_in_bytes for f in members[1:])
        if members[0].file_size_in_bytes <= rest:
            break
        members = members[1:]
    return members


def _bin_pack(
    files: list[DataFileInfo], size_of: Callable[[DataFileInfo], int], capacity: int
) -> list[list[DataFileInfo]]:
    """First-fit decreasing by live bytes: groups of at most ``capacity`` bytes (a file
    bigger than that is a group of its own)."""
    bins: list[tuple[int, list[DataFileInfo]]] = []
    for f in sorted(files, key=lambda f: -size_of(f)):
        size = size_of(f)
        for i, (used, members) in enumerate(bins):
            if used + size <= capacity:
                members.append(f)
                bins[i] = (used + size, members)
                break
        else:
            bins.append((size, [f]))
    return [members for _, members in bins]
