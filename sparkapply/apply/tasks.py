"""What one Spark task does: fold one table's changes of a batch and write its files.

The task description and the result are small and picklable; errors come back as
values (our errors pickle with their context) instead of Java stack traces.

Four paths, chosen per table and batch:
- insert-only (the driver saw no UPDATE, DELETE or TRUNCATE): column-wise append;
- keyed: the vectorised fold (``keyfold.py``), then position deletes for the rows it
  replaces (``effect.py``);
- full: the vectorised multiset fold of a REPLICA IDENTITY FULL table
  (``fullfold.py``), then position deletes for the live rows equal to removed images;
- the row-wise fold (``fold.py``) for what the vectorised folds leave to it (a key
  change with unchanged TOAST values, key columns that change mid-batch, a table
  without identity that was truncated, identities mixed in one transaction), with
  the same merge-on-read output.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa

from sparkapply import collector
from sparkapply.apply.effect import WriteResult, apply_delta, write_effect, write_full_effect
from sparkapply.apply.fold import TxnInput, fold_table
from sparkapply.apply.fullfold import fold_full
from sparkapply.apply.inserts import append_inserts
from sparkapply.apply.keyfold import NeedsRowFold, fold_keyed
from sparkapply.apply.writer import TableWriter
from sparkapply.errors import InternalError, SparkapplyError
from sparkapply.lsn import format_lsn
from sparkapply.sink.files import DataFileInfo
from sparkapply.sink.rowdelta import DeleteFileInfo

# How a table's changes name their rows in a batch: by key columns, by whole image
# (FULL), not at all (no identity: inserts only), or several of these because the
# identity changed inside a transaction (the row-wise fold's MIXED IDENTITIES).
Identity = Literal["key", "full", "none", "mixed"]


@dataclass(frozen=True, slots=True)
class TableTask:
    table: str  # "namespace.table", for messages
    relation_ids: frozenset[int]
    keyed: bool
    key_names: tuple[str, ...]
    txns: tuple[TxnInput, ...]
    schema: pa.Schema  # the Iceberg table's current schema, as Arrow
    data_files: tuple[DataFileInfo, ...]  # live data files of the table
    delete_files: tuple[DeleteFileInfo, ...]  # live position-delete files
    data_dir: str
    proto_version: int
    streaming: str
    insert_only: bool = False  # no txn of the batch updates, deletes or truncates it
    partition: tuple[int, int] = (0, 1)  # (index, count): the keys this task owns
    identity: Identity = "key"


@dataclass(slots=True)
class TableResult:
    table: str
    added: list[str] = field(default_factory=list)
    deletes: list[DeleteFileInfo] = field(default_factory=list)
    rows_written: int = 0
    rows_removed: int = 0
    n_changes: int = 0
    # Row changes by operation (filled by the apply path; 0 where it does not count).
    n_inserts: int = 0
    n_updates: int = 0
    n_deletes: int = 0
    truncated: bool = False
    last_commit_lsn: int = 0
    path: str = ""  # which path applied it: insert-only, keyed, row-wise
    partition: int = 0
    tasks: int = 1  # tasks that folded the table (key-hash partitions)
    seconds: float = 0.0
    # Seconds by phase, disjoint: "decode" (insert-only: spool read, decode, Arrow) or
    # "fold" (spool read, decode, net effect per key); "locate" (finding the replaced
    # rows in live files); "write" (Parquet data and delete files).
    timings: dict[str, float] = field(default_factory=dict)
    error: SparkapplyError | None = None

    def take(self, written: WriteResult) -> None:
        self.added = written.added
        self.deletes = written.deletes
        self.rows_written = written.rows_written
        self.rows_removed = written.rows_removed


def run_table_task(task: TableTask) -> TableResult:
    result = TableResult(task.table, partition=task.partition[0])
    started = time.perf_counter()
    try:
        with collector.paused():  # the fold: many short-lived objects, no cycles
            _run(task, result)
    except SparkapplyError as exc:
        result.error = exc.with_context(table=task.table)
    except Exception as exc:  # an executor bug must still name the table and the LSNs
        result.error = internal_error(exc, task.table, [t.commit_lsn for t in task.txns])
    finally:
        result.seconds = time.perf_counter() - started
    return result


def internal_error(exc: Exception, table: str | None, commit_lsns: Sequence[int]) -> InternalError:
    """A bug met while applying ``table``'s (or the batch's) transactions with these
    commit LSNs."""
    lsns = (
        f"{format_lsn(min(commit_lsns))}..{format_lsn(max(commit_lsns))}" if commit_lsns else None
    )
    return InternalError(
        f"unexpected {type(exc).__name__} while applying: {exc}",
        table=table,
        lsns=lsns,
        hint="this is a bug in sparkapply, not in the data: nothing of the batch was "
        "acknowledged; report it with this message and the log",
    )


def _run(task: TableTask, result: TableResult) -> None:
    writer = TableWriter(task.data_dir, task.schema)
    try:
        _fold_and_write(task, result, writer)
    finally:
        result.timings["write"] = writer.seconds


def _fold_and_write(task: TableTask, result: TableResult, writer: TableWriter) -> None:
    """The task's phases, timed: what is not the writer's own time in the second
    phase (``write_effect``, ``apply_delta``) is locating the rows it replaces."""
    timings = result.timings
    started = time.perf_counter()
    result.last_commit_lsn = max(t.commit_lsn for t in task.txns)
    if task.insert_only:
        written, n_changes = append_inserts(
            task.relation_ids,
            task.txns,
            schema=task.schema,
            writer=writer,
            proto_version=task.proto_version,
            streaming=task.streaming,
        )
        timings["decode"] = time.perf_counter() - started - writer.seconds
        result.take(written)
        result.n_changes = result.n_inserts = n_changes
        result.path = "insert-only"
        return
    if task.keyed:
        try:
            effect = fold_keyed(
                task.relation_ids,
                task.txns,
                schema=task.schema,
                key_names=task.key_names,
                proto_version=task.proto_version,
                streaming=task.streaming,
                table=task.table,
                partition=task.partition,
            )
        except NeedsRowFold:
            # Every partition finds the same: partition 0 folds the whole table.
            if task.partition[0] != 0:
                result.path = "row-wise"
                return
        else:
            folded = time.perf_counter()
            timings["fold"] = folded - started
            result.take(
                write_effect(
                    effect,
                    key_names=task.key_names,
                    data_files=task.data_files,
                    delete_files=task.delete_files,
                    writer=writer,
                )
            )
            timings["locate"] = time.perf_counter() - folded - writer.seconds
            if task.partition[0] == 0:  # every partition decoded every change
                result.n_changes = effect.n_changes
                result.n_inserts = effect.n_inserts
                result.n_updates = effect.n_updates
                result.n_deletes = effect.n_deletes
            result.truncated = effect.truncated
            result.path = "keyed"
            return
    if task.identity == "full":
        try:
            full = fold_full(
                task.relation_ids,
                task.txns,
                schema=task.schema,
                proto_version=task.proto_version,
                streaming=task.streaming,
                table=task.table,
            )
        except NeedsRowFold:
            pass
        else:
            folded = time.perf_counter()
            timings["fold"] = folded - started
            result.take(
                write_full_effect(
                    full,
                    schema=task.schema,
                    data_files=task.data_files,
                    delete_files=task.delete_files,
                    writer=writer,
                )
            )
            timings["locate"] = time.perf_counter() - folded - writer.seconds
            result.n_changes = full.n_changes
            result.n_inserts = full.n_inserts
            result.n_updates = full.n_updates
            result.n_deletes = full.n_deletes
            result.truncated = full.truncated
            result.path = "full"
            return
    delta = fold_table(
        task.relation_ids,
        task.keyed,
        task.txns,
        proto_version=task.proto_version,
        streaming=task.streaming,
        table=task.table,
        mixed=task.identity == "mixed",
    )
    folded = time.perf_counter()
    timings["fold"] = folded - started  # with a keyed attempt that needed this fold
    result.take(
        apply_delta(
            delta,
            schema=task.schema,
            key_names=task.key_names,
            data_files=task.data_files,
            delete_files=task.delete_files,
            writer=writer,
        )
    )
    timings["locate"] = time.perf_counter() - folded - writer.seconds
    result.n_changes = delta.n_changes
    result.truncated = delta.truncated
    result.path = "row-wise"
