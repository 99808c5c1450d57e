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

import contextlib
import enum
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from sparkapply import collector
from sparkapply.apply.effect import WriteResult, apply_delta, write_effect, write_full_effect
from sparkapply.apply.fold import TxnInput, fold_table
from sparkapply.apply.fullfold import FullEffect, fold_full
from sparkapply.apply.inserts import append_inserts
from sparkapply.apply.keyfold import NeedsRowFold, NetEffect, fold_keyed
from sparkapply.apply.writer import TableWriter
from sparkapply.errors import InternalError, SparkapplyError
from sparkapply.lsn import format_lsn
from sparkapply.plan.batch import Identity
from sparkapply.sink.files import DataFileInfo
from sparkapply.sink.rowdelta import DeleteFileInfo


@dataclass(frozen=True, slots=True)
class TableTask:
    table: str  # "namespace.table", for messages
    relation_ids: frozenset[int]
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

    @property
    def keyed(self) -> bool:
        return self.identity == "key"


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


class FoldPath(enum.Enum):
    """How a task turns its transactions into files, decided in one place
    (:func:`choose_path`), as PostgreSQL's ``get_transaction_apply_action`` decides
    how a transaction is applied."""

    INSERT_ONLY = "insert-only"  # only inserts: decode straight into data files
    KEYED = "keyed"  # net effect per key, vectorised (apply/keyfold.py)
    FULL = "full"  # REPLICA IDENTITY FULL: net effect per row image (apply/fullfold.py)
    ROW_WISE = "row-wise"  # change by change (apply/fold.py): what the others cannot net


def choose_path(task: TableTask) -> FoldPath:
    """The path a task takes first. A keyed or full fold that meets what it cannot
    net (a key that moves and comes back, an identity that changes mid-transaction:
    the fold raises :class:`NeedsRowFold` saying why) leaves it to the row-wise fold."""
    if task.insert_only:
        return FoldPath.INSERT_ONLY
    if task.identity == "key":
        return FoldPath.KEYED
    if task.identity == "full":
        return FoldPath.FULL
    return FoldPath.ROW_WISE


def _fold_and_write(task: TableTask, result: TableResult, writer: TableWriter) -> None:
    """The task's phases, timed: what is not the writer's own time in the second
    phase (``write_effect``, ``apply_delta``) is locating the rows it replaces."""
    result.last_commit_lsn = max(t.commit_lsn for t in task.txns)
    path = choose_path(task)
    started = time.perf_counter()
    try:
        _PATHS[path](task, result, writer, started)
    except NeedsRowFold:
        path = FoldPath.ROW_WISE
        # Every partition finds the same: partition 0 folds the whole table (its
        # fold time counts the attempt).
        if task.partition[0] == 0:
            _row_wise(task, result, writer, started)
    result.path = path.value


@contextlib.contextmanager
def _locating(result: TableResult, writer: TableWriter, started: float) -> Iterator[None]:
    """The phase after the fold: what is not the writer's time is locating rows."""
    folded = time.perf_counter()
    result.timings["fold"] = folded - started
    yield
    result.timings["locate"] = time.perf_counter() - folded - writer.seconds


def _count(result: TableResult, effect: NetEffect | FullEffect) -> None:
    result.n_changes = effect.n_changes
    result.n_inserts = effect.n_inserts
    result.n_updates = effect.n_updates
    result.n_deletes = effect.n_deletes


def _append(task: TableTask, result: TableResult, writer: TableWriter, started: float) -> None:
    written, n_changes = append_inserts(
        task.relation_ids,
        task.txns,
        schema=task.schema,
        writer=writer,
        proto_version=task.proto_version,
        streaming=task.streaming,
    )
    result.timings["decode"] = time.perf_counter() - started - writer.seconds
    result.take(written)
    result.n_changes = result.n_inserts = n_changes


def _keyed(task: TableTask, result: TableResult, writer: TableWriter, started: float) -> None:
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
    with _locating(result, writer, started):
        written = write_effect(
            effect,
            key_names=task.key_names,
            data_files=task.data_files,
            delete_files=task.delete_files,
            writer=writer,
        )
    result.take(written)
    if task.partition[0] == 0:  # every partition decoded every change
        _count(result, effect)
    result.truncated = effect.truncated


def _full(task: TableTask, result: TableResult, writer: TableWriter, started: float) -> None:
    full = fold_full(
        task.relation_ids,
        task.txns,
        schema=task.schema,
        proto_version=task.proto_version,
        streaming=task.streaming,
        table=task.table,
    )
    with _locating(result, writer, started):
        written = write_full_effect(
            full,
            schema=task.schema,
            data_files=task.data_files,
            delete_files=task.delete_files,
            writer=writer,
        )
    result.take(written)
    _count(result, full)
    result.truncated = full.truncated


def _row_wise(task: TableTask, result: TableResult, writer: TableWriter, started: float) -> None:
    delta = fold_table(
        task.relation_ids,
        task.keyed,
        task.txns,
        proto_version=task.proto_version,
        streaming=task.streaming,
        table=task.table,
        mixed=task.identity == "mixed",
    )
    with _locating(result, writer, started):
        written = apply_delta(
            delta,
            schema=task.schema,
            key_names=task.key_names,
            data_files=task.data_files,
            delete_files=task.delete_files,
            writer=writer,
        )
    result.take(written)
    result.n_changes = delta.n_changes
    result.truncated = delta.truncated


_PATHS: dict[FoldPath, Callable[[TableTask, TableResult, TableWriter, float], None]] = {
    FoldPath.INSERT_ONLY: _append,
    FoldPath.KEYED: _keyed,
    FoldPath.FULL: _full,
    FoldPath.ROW_WISE: _row_wise,
}
