"""Staging one chunk of a streamed transaction while it is still running. Executor side.

A piece is a byte range of the transaction's spool file, closed at a STREAM STOP. For
every table the piece touches, the task decodes its inserts column-wise and writes
them as data files of the table's current schema, exactly as the insert-only apply
would at commit (``apply/fold/append.py``). A table that the piece updates, deletes from or
truncates gets no files: such a transaction is applied from the spool at commit, and
its other pieces' files are discarded. Nothing here is visible to a reader; the driver
decides at commit which files to use (``stager.py``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import pyarrow as pa

from sparkapply import collector
from sparkapply.apply.fold.append import append_inserts
from sparkapply.apply.fold.rowwise import TxnInput
from sparkapply.apply.write.parquet import TableWriter, filesystem
from sparkapply.changes.spool import SpoolSegment
from sparkapply.errors import ApplyError, NotInsertOnly, SparkapplyError
from sparkapply.pgoutput import messages as m


@dataclass(frozen=True, slots=True)
class StageTable:
    """One table a piece touches, as it is when the piece is staged."""

    name: str  # "namespace.table"
    relation_ids: frozenset[int]
    schema: pa.Schema
    schema_id: int  # the Iceberg schema the files are written in
    data_dir: str
    prefix: str = "sparkapply-staged-"  # of the names of the files the piece writes


@dataclass(frozen=True, slots=True)
class StageTask:
    xid: int
    segment: SpoolSegment
    relations: tuple[m.Relation, ...]  # descriptions in effect at the segment's start
    tables: tuple[StageTable, ...]
    proto_version: int
    streaming: str


@dataclass(slots=True)
class StagedFiles:
    """What a piece wrote for one table; ``mutated`` when it holds other changes than
    inserts (no files then)."""

    table: str
    schema_id: int
    files: list[str] = field(default_factory=list)
    rows: int = 0
    changes: int = 0
    mutated: bool = False


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
        with collector.paused():  # as the apply tasks: many short-lived objects, no cycles
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

    def write(self, table: pa.Table) -> str:
        uri = super().write(table)
        self.paths.append(uri)
        return uri

    def remove_all(self) -> None:
        for uri in self.paths:
            fs, path = filesystem(uri)
            with contextlib.suppress(OSError):
                fs.delete_file(path)


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
        out.mutated = True
        return out
    except BaseException:
        writer.remove_all()
        raise
    out.files = written.added
    out.rows = written.rows_written
    out.changes = changes
    return out
