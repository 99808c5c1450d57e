"""Carry a compaction over the apply's commits that landed while it ran. Driver side.

WHY
    A compaction is planned against one snapshot and its rewrite takes about half a
    second; on a table the apply commits to a few times a second, some batch commits
    in between. Refusing then (and, after two lost races, holding the table from plan
    to commit) made every batch of that table wait for the whole rewrite. Instead,
    under the table's lock (held only for this and the commit), the rewrite is
    carried over to the new head, as a rebase.

WHAT CHANGES MEANWHILE
    The apply only adds files between two compactions: data files (never named by the
    plan) and position-delete files. A new delete file may name rows of a data file
    the compaction rewrote. Each rewritten file's live rows were copied in order to one
    new file from an offset (:class:`~sparkapply.maintain.tasks.Moved`), so such a row
    at position ``p`` is at ``offset + p - (positions deleted at the plan before p)``
    there. Those translated positions go into one new delete file committed with the
    rewrite, so they apply to the new files (same sequence number) as the originals
    applied to the old ones. The originals stay: what they name of removed files
    applies to nothing, and a later compaction drops or merges them.

    Anything else (a file the plan removes is no longer live: a TRUNCATE, another
    process's maintenance) cannot be carried over: the commit is refused as before
    (:class:`~sparkapply.errors.CommitConflictError`) and the next run plans again.

WHERE THE FILE IS WRITTEN
    Here, on the driver: it must match the head read under the lock, and it is the size
    of one batch's deletes of the rewritten files (kilobytes), beside the manifests the
    driver writes for the same commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pyiceberg.table import Table

from sparkapply.apply.write.locate import DeletedPositions
from sparkapply.apply.write.parquet import TableWriter
from sparkapply.datafiles import DeleteFileInfo, arrow_schema_of, data_directory
from sparkapply.maintain.plan import listing
from sparkapply.maintain.tasks import Moved
from sparkapply.sink.files import delete_file_infos


def translate(
    moved: Mapping[str, Moved], deleted: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``deleted`` positions (by data file) of rewritten files, as positions of the
    files their rows moved to; positions already deleted at the plan are dropped, and
    files not rewritten are not named."""
    out: dict[str, list[np.ndarray]] = {}
    for path, positions in deleted.items():
        m = moved.get(path)
        if m is None or not len(positions):
            continue
        pos = np.unique(np.asarray(positions, np.int64))
        pos = pos[~np.isin(pos, m.deleted)]
        if not len(pos):
            continue
        out.setdefault(m.path, []).append(m.offset + pos - np.searchsorted(m.deleted, pos))
    return {p: np.unique(np.concatenate(parts)) for p, parts in out.items()}


def carried_deletes(
    table: Table, planned_deletes: Sequence[DeleteFileInfo], moved: Mapping[str, Moved]
) -> DeleteFileInfo | None:
    """One delete file naming, in the new files, the rows of rewritten files that the
    delete files added since the plan (live in ``table``'s current snapshot, not in
    ``planned_deletes``) delete; None when there are none."""
    planned = {d.path for d in planned_deletes}
    new = [d for d in delete_file_infos(listing(table)) if d.path not in planned]
    if not new or not moved:
        return None
    found = DeletedPositions(new, list(moved))
    positions = translate(moved, {path: found.of(path) for path in moved})
    if not positions:
        return None
    return TableWriter(data_directory(table), arrow_schema_of(table)).write_deletes(positions)
