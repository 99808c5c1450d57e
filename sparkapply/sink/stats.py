"""What a table holds, for ``sparkapply status``: applied LSN, last commit, counts.

Read from the current snapshot's summary (``total-records``,
``total-position-deletes``, ``total-data-files``, ``total-delete-files``), which every
writer (pyiceberg, Spark, Trino) keeps up to date, so no manifest is opened. The rows
are the records less the position deletes: merge-on-read keeps a replaced row's old
version in its data file until compaction, named by a position delete, and a reader
sees the table's rows, not its records. Read-only: safe while ``run`` commits.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from sparkapply.lsn import Lsn
from sparkapply.sink.progress import applied_lsn


@dataclass(frozen=True, slots=True)
class TableStats:
    identifier: str  # "namespace.table"
    exists: bool
    applied_lsn: Lsn | None = None
    last_commit: dt.datetime | None = None  # the current snapshot's time (UTC)
    snapshot_id: int | None = None
    rows: int | None = None
    data_files: int | None = None
    delete_files: int | None = None


def table_stats(catalog: Catalog, ident: tuple[str, str]) -> TableStats:
    name = ".".join(ident)
    try:
        table = catalog.load_table(ident)
    except (NoSuchTableError, NoSuchNamespaceError):
        return TableStats(name, exists=False)
    snapshot = table.current_snapshot()
    lsn = applied_lsn(table)
    if snapshot is None:
        return TableStats(name, exists=True, applied_lsn=lsn, rows=0, data_files=0, delete_files=0)
    summary = snapshot.summary

    def count(key: str) -> int | None:
        value = summary[key] if summary is not None else None
        return None if value is None else int(value)

    return TableStats(
        name,
        exists=True,
        applied_lsn=lsn,
        last_commit=dt.datetime.fromtimestamp(snapshot.timestamp_ms / 1000, dt.UTC),
        snapshot_id=snapshot.snapshot_id,
        rows=live_rows(table),
        data_files=count("total-data-files"),
        delete_files=count("total-delete-files"),
    )


def live_rows(table: Table) -> int | None:
    """The rows ``table`` holds at its current snapshot (None: its summary does not say)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return 0
    summary = snapshot.summary
    if summary is None or summary["total-records"] is None:
        return None
    return int(summary["total-records"]) - int(summary["total-position-deletes"] or 0)
