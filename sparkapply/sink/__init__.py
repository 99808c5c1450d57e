"""Iceberg: catalog, tables, schema evolution, commits, applied-LSN read-back.

The only package that imports pyiceberg's catalog and table APIs. The driver uses it;
executors only receive what it hands out (the descriptions in :mod:`sparkapply.datafiles`).
"""

from sparkapply.errors import CommitConflictError, CommitOutcomeUnknownError
from sparkapply.sink.catalog import mask_properties, open_catalog
from sparkapply.sink.commit import ANY_BASE, commit_files
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
    "TableIdentifier",
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
