"""Staging one chunk of a streamed transaction while it is still running. Executor side.

A piece is a byte range of the transaction's spool file, closed at a STREAM STOP. For
every table the piece touches, the task decodes its inserts column-wise and writes
them as data files of the table's current schema, exactly as the insert-only apply
would at commit (``apply/fold/append.py``).

A keyed table the piece also updates or deletes from is folded as the apply folds a
batch (``apply/fold/keyed.py``): the piece's net effect per key. Its final rows go to
data files, and the keys whose pre-transaction rows it replaces to a *removes* file
(the key columns, Parquet, beside the data files). At commit the apply locates those
keys in the table and checks that no key is named by two pieces in a way that only a
fold over both could net (``apply/fold/staged.py``). What the piece cannot net alone
(a TRUNCATE, unchanged TOAST values, a table without a key or with REPLICA IDENTITY
FULL) gets no files: that transaction is applied from the spool at commit, and its
other pieces' files are discarded.

Nothing here is visible to a reader; the driver decides at commit which files to use
(``stager.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from sparkapply import collector
from sparkapply.apply.fold.append import append_inserts
from sparkapply.apply.fold.keyed import fold_keyed
from sparkapply.apply.fold.path import NeedsRowFold
from sparkapply.apply.fold.rowwise import TxnInput
from sparkapply.apply.write.effect import ROWS_PER_FILE
from sparkapply.apply.write.parquet import TableWriter, filesystem
from sparkapply.changes.spool import SpoolSegment
from sparkapply.errors import ApplyError, NotInsertOnly, SparkapplyError
from sparkapply.pgoutput import messages as m
from sparkapply.storage import Storage, using


@dataclass(frozen=True, slots=True)
class StageTable:
    """One table a piece touches, as it is when the piece is staged."""

    name: str  # "namespace.table"
    relation_ids: frozenset[int]
    schema: pa.Schema
    schema_id: int  # the Iceberg schema the files are written in
    data_dir: str
    prefix: str = "sparkapply-staged-"  # of the names of the files the piece writes
    # Its replica-identity key; none: only inserts can be staged (no key, or FULL).
    key_names: tuple[str, ...] = ()
    # The transaction has updated, deleted from or truncated it by the piece's end:
    # the piece is folded by key at once, not tried as inserts first.
    mutated: bool = False


@dataclass(frozen=True, slots=True)
class StageTask:
    xid: int
    segment: SpoolSegment
    relations: tuple[m.Relation, ...]  # descriptions in effect at the segment's start
    tables: tuple[StageTable, ...]
    proto_version: int
    streaming: str
    # The object store's settings, keys included: pickled with the task, never logged.
    storage: Storage = field(kw_only=True)


@dataclass(slots=True)
class StagedFiles:
    """What a piece wrote for one table; ``mutated`` when it holds changes the piece
    cannot net alone (no files then). ``keyed``: the files are the piece's net effect
    by key, and ``removes`` names the keys of the pre-transaction rows it replaces."""

    table: str
    schema_id: int
    files: list[str] = field(default_factory=list)
    rows: int = 0
    changes: int = 0  # source row changes, of which:
    updates: int = 0
    deletes: int = 0  # (the rest are inserts)
    mutated: bool = False
    keyed: bool = False
    removes: str | None = None  # a Parquet file of key columns (keyed pieces only)

    def written(self) -> list[str]:
        """Every file the piece wrote for the table (what discarding it deletes)."""
        return [*self.files, *([self.removes] if self.removes else [])]


@dataclass(slots=True)
class StageResult:
    tables: list[StagedFiles] = field(default_factory=list)
    seconds: float = 0.0
    error: SparkapplyError | None = None
    journal: str | None = None  # set by the driver once the files are journalled


def run_stage_task(task: StageTask) -> StageResult:
    result = StageResult()
    started = time.perf_counter()
    try:
        # As the apply tasks: many short-lived objects, no cycles.
        with collector.paused(), using(task.storage):
            for table in task.tables:
                result.tables.append(_stage_table(task, table))
    except SparkapplyError as exc:
        result.error = exc.with_context(xid=task.xid)
    except Exception as exc:  # a bug must still say where
        result.error = ApplyError(f"staging failed: {type(exc).__name__}: {exc}", xid=task.xid)
    finally:
        result.seconds = time.perf_counter() - started
    return result


class _KeptWriter(TableWriter):
    """Remembers what it wrote, so that a piece that cannot be used leaves nothing."""

    def __init__(self, data_dir: str, schema: pa.Schema, prefix: str) -> None:
        super().__init__(data_dir, schema, prefix=prefix)
        self.paths: list[str] = []

    def write(self, table: pa.Table, written: Callable[[str, pa.Table], None] | None = None) -> str:
        uri = super().write(table, written)
        self.paths.append(uri)
        return uri

    def write_keys(self, keys: pa.Table) -> str:
        uri = super().write_keys(keys)
        self.paths.append(uri)
        return uri

    def remove_all(self) -> None:
        for uri in self.paths:
            fs, path = filesystem(uri)
            with contextlib.suppress(OSError):
                fs.delete_file(path)
        self.paths = []


def _stage_table(task: StageTask, table: StageTable) -> StagedFiles:
    out = StagedFiles(table.name, table.schema_id)
    txn = TxnInput(
        ordinal=0,
        xid=task.xid,
        commit_lsn=0,
        segments=(task.segment,),
        relations=tuple(r for r in task.relations if r.relation_id in table.relation_ids),
    )
    writer = _KeptWriter(table.data_dir, table.schema, table.prefix)
    try:
        if table.mutated and table.key_names:
            return _stage_keyed(task, table, txn, writer, out)
        written, changes = append_inserts(
            table.relation_ids,
            (txn,),
            schema=table.schema,
            writer=writer,
            proto_version=task.proto_version,
            streaming=task.streaming,
        )
    except NotInsertOnly:
        writer.remove_all()
        if table.key_names:
            return _stage_keyed(task, table, txn, writer, out)
        out.mutated = True
        return out
    except BaseException:
        writer.remove_all()
        raise
    out.files = written.added
    out.rows = written.rows_written
    out.changes = changes
    return out


def _stage_keyed(
    task: StageTask, table: StageTable, txn: TxnInput, writer: _KeptWriter, out: StagedFiles
) -> StagedFiles:
    """The piece's net effect by key: its final rows, and the keys it removes."""
    try:
        effect = fold_keyed(
            table.relation_ids,
            (txn,),
            schema=table.schema,
            key_names=table.key_names,
            proto_version=task.proto_version,
            streaming=task.streaming,
            table=table.name,
        )
    except NeedsRowFold:
        out.mutated = True
        return out
    if effect.truncated or effect.fills:
        # A TRUNCATE empties what earlier pieces staged; an unchanged TOAST value
        # is the row's before the piece, which may be another piece's.
        out.mutated = True
        return out
    try:
        upserts = effect.upserts
        for start in range(0, upserts.num_rows, ROWS_PER_FILE):
            out.files.append(writer.write(upserts.slice(start, ROWS_PER_FILE)))
        if effect.remove_keys:
            names = list(table.key_names)
            keys = pa.table(dict(zip(names, effect.remove_keys, strict=True)))
            out.removes = writer.write_keys(keys)
    except BaseException:
        writer.remove_all()
        raise
    out.keyed = True
    out.rows = upserts.num_rows
    out.changes = effect.n_changes
    out.updates = effect.n_updates
    out.deletes = effect.n_deletes
    return out
