"""What one Spark task does: fold one table's changes of a batch and write its files.

The task description and the result are small and picklable; errors come back as
values (our errors pickle with their context) instead of Java stack traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from sparkapply.apply.fold import TxnInput, fold_table
from sparkapply.apply.merge import TableWriter, apply_delta
from sparkapply.errors import ApplyError, SparkapplyError


@dataclass(frozen=True, slots=True)
class TableTask:
    table: str  # "namespace.table", for messages
    relation_ids: frozenset[int]
    keyed: bool
    key_names: tuple[str, ...]
    txns: tuple[TxnInput, ...]
    schema: pa.Schema  # the Iceberg table's current schema, as Arrow
    data_files: tuple[str, ...]  # live data files (URIs) of the table
    data_dir: str
    proto_version: int
    streaming: str


@dataclass(slots=True)
class TableResult:
    table: str
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rows_written: int = 0
    rows_removed: int = 0
    n_changes: int = 0
    truncated: bool = False
    last_commit_lsn: int = 0
    error: SparkapplyError | None = None


def run_table_task(task: TableTask) -> TableResult:
    result = TableResult(task.table)
    try:
        delta = fold_table(
            task.relation_ids,
            task.keyed,
            task.txns,
            proto_version=task.proto_version,
            streaming=task.streaming,
            table=task.table,
        )
        writer = TableWriter(task.data_dir, task.schema)
        written = apply_delta(
            delta,
            schema=task.schema,
            key_names=task.key_names,
            data_files=task.data_files,
            writer=writer,
        )
        result.added = written.added
        result.removed = written.removed
        result.rows_written = written.rows_written
        result.rows_removed = written.rows_removed
        result.n_changes = delta.n_changes
        result.truncated = delta.truncated
        result.last_commit_lsn = delta.last_commit_lsn
    except SparkapplyError as exc:
        result.error = exc.with_context(table=task.table)
    except Exception as exc:  # an executor bug must still name the table
        result.error = ApplyError(f"{type(exc).__name__}: {exc}", table=task.table)
    return result
