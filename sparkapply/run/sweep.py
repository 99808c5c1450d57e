"""The sweep, at a session's start, of the files staging wrote for transactions that
never committed (the journal and the records: :mod:`sparkapply.staging.records`).

SWEEP
    At start, the files the journal names that no snapshot of their table references
    are deleted (they belong to a transaction the server will send again), except
    those a record keeps; then the journal is emptied. Which files a table references
    is the sink's to say, so the sweep runs here, where staging and the sink meet.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sparkapply.errors import SparkapplyError
from sparkapply.sink.maintenance import list_files, unreferenced
from sparkapply.staging.records import delete_files, journalled, waiting_files
from sparkapply.state.layout import staging_dir

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)


def sweep_staged(work_dir: Path, catalog: Catalog) -> int:
    """At start: delete the files of journalled pieces that no snapshot of their table
    references, and the journal. Returns how many files were deleted."""
    root = staging_dir(work_dir)
    if not root.is_dir():
        return 0
    kept = waiting_files(work_dir)  # staged for prepared transactions
    entries, tables = journalled(root)
    by_table: dict[str, list[str]] = {}
    for name, data_dir, prefix in tables:
        try:
            by_table.setdefault(name, []).extend(_named(data_dir, prefix))
        except SparkapplyError as exc:  # the orphan sweep removes them later
            log.warning("cannot list the staged files of %s: %s", name, exc)
    deleted = 0
    for name, files in by_table.items():
        namespace, _, table_name = name.rpartition(".")
        try:
            table = catalog.load_table((namespace, table_name))
            doomed = unreferenced(table, [f for f in files if f not in kept])
        except Exception as exc:  # the orphan sweep removes them later
            log.warning("cannot check the staged files of %s: %s", name, exc)
            continue
        delete_files(doomed)
        deleted += len(doomed)
    for entry in entries:
        entry.unlink(missing_ok=True)
    if deleted:
        log.info("removed %d staged files of transactions that never committed", deleted)
    return deleted


def _named(data_dir: str, prefix: str) -> list[str]:
    """The files directly under ``data_dir`` whose names start with ``prefix``."""
    return [
        uri
        for uri, _size, _mtime in list_files(data_dir)
        if uri.rsplit("/", 1)[-1].startswith(prefix)
    ]
