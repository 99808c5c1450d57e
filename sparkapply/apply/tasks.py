"""What one Spark task does: fold one table's changes of a batch and write its files.

The task description and the result are small and picklable; errors come back as
values (our errors pickle with their context) instead of Java stack traces.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import pyarrow as pa

from sparkapply.apply.fold import TxnInput, fold_table
from sparkapply.apply.inserts import append_inserts
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
    insert_only: bool = False  # no txn of the batch updates, deletes or truncates it


@dataclass(slots=True)
class TableResult:
    table: str
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rows_written: int = 0
    rows_removed: int = 0
    n_changes: int = 0
    # Row changes by operation (filled by the apply path; 0 where it does not count).
    n_inserts: int = 0
    n_updates: int = 0
    n_deletes: int = 0
    truncated: bool = False
    last_commit_lsn: int = 0
    error: SparkapplyError | None = None


def run_table_task(task: TableTask) -> TableResult:
    result = TableResult(task.table)
    # The fold makes millions of short-lived objects and no cycles worth collecting.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if task.insert_only:
            written, n_changes = append_inserts(
                task.relation_ids,
                task.txns,
                schema=task.schema,
                writer=TableWriter(task.data_dir, task.schema),
                proto_version=task.proto_version,
                streaming=task.streaming,
            )
            result.added = written.added
            result.rows_written = written.rows_written
            result.n_changes = n_changes
            result.last_commit_lsn = max(t.commit_lsn for t in task.txns)
            return result
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
    finally:
        if gc_was_enabled:
            gc.enable()
    return result
