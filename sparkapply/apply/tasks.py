"""What one Spark task does: fold one table's changes of a batch and write its files.

The task description and the result are small and picklable; errors come back as
values (our errors pickle with their context) instead of Java stack traces.

Four paths, chosen per table and batch by :func:`~sparkapply.apply.fold.path.choose_path`:
- insert-only (the driver saw no UPDATE, DELETE or TRUNCATE): column-wise append
  (``fold/append.py``);
- keyed: the vectorised fold (``fold/keyed.py``), then position deletes for the rows
  it replaces (``write/effect.py``);
- full: the vectorised multiset fold of a REPLICA IDENTITY FULL table
  (``fold/full.py``), then position deletes for the live rows equal to removed images;
- the row-wise fold (``fold/rowwise.py``) for what the vectorised folds leave to it (a
  key change with unchanged TOAST values, key columns that change mid-batch, a table
  without identity that was truncated, identities mixed in one transaction), with
  the same merge-on-read output;
- staged keyed: a streamed transaction's pieces, netted by key while it arrived,
  composed with the keyed fold of the rest of its spool (``fold/staged.py``); when
  they do not compose the result says ``unstaged`` and the driver applies the
  transaction from the spool.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from sparkapply import collector
from sparkapply.apply.fold.append import append_inserts
from sparkapply.apply.fold.full import FullEffect, fold_full
from sparkapply.apply.fold.keyed import NetEffect, fold_keyed
from sparkapply.apply.fold.path import FoldPath, NeedsRowFold, choose_path
from sparkapply.apply.fold.rowwise import TableDelta, TxnInput, fold_table
from sparkapply.apply.fold.staged import composed_removes, owned_effect
from sparkapply.apply.write.effect import (
    Target,
    WriteResult,
    apply_delta,
    write_effect,
    write_full_effect,
)
from sparkapply.apply.write.parquet import TableWriter
from sparkapply.changes.staged import PieceFiles
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo
from sparkapply.errors import InternalError, SparkapplyError
from sparkapply.lsn import format_lsn
from sparkapply.plan.batch import Identity
from sparkapply.storage import Storage, refused, using


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
    # Pieces staged by key while the (one) transaction arrived; ``txns`` holds the
    # rest of its spool (fold/staged.py).
    staged: tuple[PieceFiles, ...] = ()
    # The object store's settings, keys included: pickled with the task, never logged.
    storage: Storage = field(kw_only=True)

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
    # The staged pieces do not compose (fold/staged.py): nothing was written, and
    # the driver applies the transaction from the spool.
    unstaged: bool = False
    last_commit_lsn: int = 0
    path: str = ""  # which path applied it: insert-only, keyed, row-wise
    partition: int = 0
    tasks: int = 1  # Spark tasks that folded the table (key-hash partitions; 0: the driver)
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
        # The fold: many short-lived objects, no cycles.
        with collector.paused(), using(task.storage):
            _run(task, result)
    except SparkapplyError as exc:
        result.error = exc.with_context(table=task.table)
    except Exception as exc:  # an executor bug must still name the table and the LSNs
        lsns = [t.commit_lsn for t in task.txns]
        result.error = refused(exc) or internal_error(exc, task.table, lsns)
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
        at=_where(exc),
        hint="this is a bug in sparkapply, not in the data: nothing of the batch was "
        "acknowledged; report it with this message and the log",
    )


def _where(exc: BaseException) -> str | None:
    """The innermost line of sparkapply's own code ``exc`` passed through, as
    ``apply/fold/keyed.py:99``: a bug report's first clue, since an executor's
    traceback does not reach the driver's log."""
    where = None
    tb = exc.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/sparkapply/" in path:
            where = f"{path.rsplit('/sparkapply/', 1)[1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _run(task: TableTask, result: TableResult) -> None:
    writer = TableWriter(task.data_dir, task.schema)
    try:
        _fold_and_write(task, result, writer)
    finally:
        result.timings["write"] = writer.seconds


def _fold_and_write(task: TableTask, result: TableResult, writer: TableWriter) -> None:
    """The task's phases, timed: the fold ("decode" for the insert-only path, which
    writes as it decodes), then writing its effect; what is not the writer's own
    time in that second phase is locating the rows it replaces."""
    result.last_commit_lsn = max(t.commit_lsn for t in task.txns)
    path = choose_path(task)
    started = time.perf_counter()
    if path is FoldPath.INSERT_ONLY:
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
        result.path = path.value
        return
    if path is FoldPath.STAGED_KEYED:
        _compose_staged(task, result, writer, started)
        return
    try:
        effect = _fold(path, task)
    except NeedsRowFold:
        path = FoldPath.ROW_WISE
        # Every partition finds the same: partition 0 folds the whole table (its
        # fold time counts the attempt).
        if task.partition[0] != 0:
            result.path = path.value
            return
        effect = _fold(path, task)
    _write_counted(effect, task, result, writer, started)
    result.truncated = effect.truncated
    result.path = path.value


def _compose_staged(
    task: TableTask, result: TableResult, writer: TableWriter, started: float
) -> None:
    """The remainder's fold with the staged pieces' removes, of the keys the task's
    partition owns (fold/staged.py, SEVERAL TASKS), or ``unstaged``."""
    result.path = FoldPath.STAGED_KEYED.value
    try:  # the whole remainder: a key's events may span the partitions' key hashes
        whole = _fold(FoldPath.KEYED, dataclasses.replace(task, partition=(0, 1)))
    except NeedsRowFold:
        result.unstaged = True
        return
    assert isinstance(whole, NetEffect)
    effect = owned_effect(whole, task.key_names, task.partition)
    removes = (
        None
        if effect.truncated
        else composed_removes(task.staged, effect, task.key_names, task.partition)
    )
    if removes is None:
        result.unstaged = True
        return
    effect.remove_keys = removes
    _write_counted(effect, task, result, writer, started)


def _write_counted(
    effect: NetEffect | FullEffect | TableDelta,
    task: TableTask,
    result: TableResult,
    writer: TableWriter,
    started: float,
) -> None:
    """Write ``effect`` into ``result``, timing the fold before (from ``started``) and
    the locate in it; partition 0 counts the changes (every partition folded them all)."""
    folded = time.perf_counter()
    result.timings["fold"] = folded - started
    result.take(_write(effect, task, writer))
    result.timings["locate"] = time.perf_counter() - folded - writer.seconds
    if task.partition[0] == 0:
        result.n_changes = effect.n_changes
        if not isinstance(effect, TableDelta):
            result.n_inserts = effect.n_inserts
            result.n_updates = effect.n_updates
            result.n_deletes = effect.n_deletes


def _fold(path: FoldPath, task: TableTask) -> NetEffect | FullEffect | TableDelta:
    """The net effect of the task's transactions on its table (its part of the keys)."""
    rids, txns, proto, streaming = task.relation_ids, task.txns, task.proto_version, task.streaming
    if path is FoldPath.KEYED:
        return fold_keyed(
            rids,
            txns,
            schema=task.schema,
            key_names=task.key_names,
            proto_version=proto,
            streaming=streaming,
            table=task.table,
            partition=task.partition,
        )
    if path is FoldPath.FULL:
        return fold_full(
            rids,
            txns,
            schema=task.schema,
            proto_version=proto,
            streaming=streaming,
            table=task.table,
        )
    mixed = task.identity == "mixed"
    return fold_table(
        rids,
        task.keyed,
        txns,
        proto_version=proto,
        streaming=streaming,
        table=task.table,
        mixed=mixed,
    )


def _write(
    effect: NetEffect | FullEffect | TableDelta, task: TableTask, writer: TableWriter
) -> WriteResult:
    """New row versions as data files, the rows they replace as position deletes."""
    keyed = task.identity == "key" and bool(task.key_names)
    target = Target(
        task.schema,
        task.data_files,
        task.delete_files,
        writer,
        key_names=tuple(task.key_names) if keyed else (),
    )
    if isinstance(effect, NetEffect):
        return write_effect(effect, task.key_names, target)
    if isinstance(effect, FullEffect):
        return write_full_effect(effect, target)
    return apply_delta(effect, task.key_names, target)
