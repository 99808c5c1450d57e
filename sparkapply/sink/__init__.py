"""Iceberg: the sink contract and what keeps it.

The front door is :mod:`sparkapply.sink.contract`: :class:`Sink` (load a table's
state, evolve it, list its live files, commit a batch, expire, remove files), its
written contract (call order, what is atomic, what a crash leaves, what may be
retried), and :class:`IcebergSink`, which keeps it with the modules below. The rest of
the surface here is for the copy, maintenance and commands, which commit one table at
a time: the table functions, the single-table commit, and the applied-LSN read-back.

The only package that imports pyiceberg's catalog and table APIs. The driver uses it;
executors only receive what it hands out (the descriptions in :mod:`sparkapply.datafiles`).
"""

from sparkapply.errors import CommitConflictError, CommitOutcomeUnknownError
from sparkapply.sink.catalog import mask_properties, open_catalog
from sparkapply.sink.commit import ANY_BASE, commit_files
from sparkapply.sink.contract import (
    CutPoint,
    IcebergSink,
    Retention,
    Sink,
    TableChange,
    TableState,
)
from sparkapply.sink.files import current_data_files, current_snapshot_id, remove_orphans
from sparkapply.sink.maintenance import expire_snapshots
from sparkapply.sink.progress import LSN_SUMMARY_KEY, LSN_TABLE_PROPERTY, applied_lsn
from sparkapply.sink.read import read_table
from sparkapply.sink.tables import (
    DEFAULT_TABLE_PROPERTIES,
    TableIdentifier,
    apply_evolution,
    ensure_table,
    table_name,
)

__all__ = [
    "ANY_BASE",
    "DEFAULT_TABLE_PROPERTIES",
    "LSN_SUMMARY_KEY",
    "LSN_TABLE_PROPERTY",
    "CommitConflictError",
    "CommitOutcomeUnknownError",
    "CutPoint",
    "IcebergSink",
    "Retention",
    "Sink",
    "TableChange",
    "TableIdentifier",
    "TableState",
    "applied_lsn",
    "apply_evolution",
    "commit_files",
    "current_data_files",
    "current_snapshot_id",
    "ensure_table",
    "expire_snapshots",
    "mask_properties",
    "open_catalog",
    "read_table",
    "remove_orphans",
    "table_name",
]
