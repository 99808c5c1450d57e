"""Staging streamed transactions while they arrive. Driver side.

WHY
    A large transaction arrives as a stream of chunks long before its STREAM COMMIT.
    Without staging all of its apply starts at the commit; the native subscriber
    applies chunks as they arrive. So when a chunk closes (STREAM STOP) and the
    transaction has spooled at least ``stage_bytes`` that are not staged yet, that
    byte range of its spool file (a *piece*) goes to a Spark task at once
    (``stage.py``), which writes its inserts as data files of the target tables.
    Receiving goes on meanwhile; the pieces in flight are bounded by
    ``stage_inflight_bytes``, and a chunk that finds the budget spent is staged with a
    later one, or applied at commit from the spool as before.

WHAT IS SPECULATIVE
    The spool stays the truth until the commit: a staged file is only used when the
    apply would have written exactly it. A piece writes a table's inserts as data
    files; for a keyed table it updates or deletes, it writes its net effect by key
    (``piece.py``). At apply time, for a table of the transaction, the table's schema
    must still be the one the files were written in, and:

    - pieces that only insert: the batch appends only to the table (no transaction
      of the batch updates, deletes or truncates it). Then the pieces' files are
      committed as they are, and only the spool after the last piece (the
      *remainder*) is read; when nothing remains, no Spark job runs at all.
    - otherwise: the transaction is the batch's only one on the table, and the task
      folds the remainder, checks that the pieces compose (no key put by one piece
      and replaced by a later one) and locates what they replace
      (``apply/fold/staged.py``); if they do not compose, the driver applies the
      transaction from the spool in a second job.

    Else the files are deleted and the whole transaction is applied from the spool.

ABORTS, DDL
    A subtransaction abort truncates the spool at the subtransaction's first change
    (``assembler.py``): every piece that reaches past that offset is discarded, and
    staging resumes from the piece boundary before it. A top-level abort, and a
    RELATION message that describes again a relation the transaction already described
    (DDL inside it), discard all of the transaction's staging.

TWO-PHASE
    At STREAM PREPARE the prepared store takes the spool; the pieces are kept with it:
    once they have all finished, a record ``prepared/<xid>.staged.json`` lists their
    files, and the journal lets go of them. COMMIT PREPARED, in this session or after a
    restart, hands them to the apply like a STREAM COMMIT; ROLLBACK PREPARED deletes
    them. A restart before the record was written sweeps the files, and the commit
    reads the prepared spool.

CRASH
    Every piece that wrote files is journalled under ``work_dir/staging`` (table and
    file URIs) before the apply can use it, and the journal entry is removed once its
    transaction's batch is committed or its files are deleted. At start, files of the
    journal that no snapshot of their table references are deleted: they belong to a
    transaction the server will send again.

MODULES
    This one schedules pieces (:class:`Stager`); ``staged.py`` holds what the apply is
    handed (:class:`StagedWork`); ``staged_files.py`` the journal, the records and the
    sweep at start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sparkapply.changes.spool import SpoolSegment, remove_spool_file
from sparkapply.changes.staged import ClosedChunk, RelationsAt
from sparkapply.datafiles import arrow_schema_of, data_directory
from sparkapply.errors import SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.pgoutput import messages as m
from sparkapply.staging.piece import StageResult, StageTable, StageTask, run_stage_task
from sparkapply.staging.records import (
    RecordedPiece,
    delete_files,
    forget_journal,
    read_record,
    write_journal,
    write_record,
)
from sparkapply.staging.staged import Piece, StagedUse, StagedWork, outcome
from sparkapply.state.layout import prepared_dir, staged_record, staging_dir
from sparkapply.storage import Storage

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

__all__ = ["Piece", "StagedUse", "StagedWork", "Stager"]  # StagedWork: where others import it

log = logging.getLogger(__name__)

TableIdent = tuple[str, str]


@dataclass(slots=True)
class _Open:
    """A streamed transaction being received."""

    pieces: list[Piece] = field(default_factory=list)
    tables: dict[TableIdent, StageTable | None] = field(default_factory=dict)
    disabled: bool = False


class Stager:
    def __init__(
        self,
        spark: SparkSession,
        catalog: Catalog,
        identifier: Callable[[m.Relation], TableIdent],
        *,
        work_dir: Path,
        stage_bytes: int,
        inflight_bytes: int,
        proto_version: int,
        streaming: str,
    ) -> None:
        self.spark = spark
        self.catalog = catalog
        self.identifier = identifier
        self.journal_dir = staging_dir(work_dir)
        self.prepared_dir = prepared_dir(work_dir)
        self.stage_bytes = stage_bytes
        self.inflight_bytes = inflight_bytes
        self.proto_version = proto_version
        self.streaming = streaming
        self._open: dict[int, _Open] = {}
        self._lock = threading.Lock()
        self._inflight = 0
        # Each piece is one Spark job; two let one start while another finishes.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sparkapply-stage")
        self._preparing: dict[int, list[Piece]] = {}  # STREAM PREPAREd, record pending
        self._prepare_lock = threading.Lock()

    # -- the assembler's side (receiving thread) ----------------------------------------

    def chunk_closed(self, chunk: ClosedChunk) -> None:
        """A chunk of ``chunk.xid`` closed with its spool at ``chunk.end``: stage what is
        unstaged if it is enough and the budget allows. ``chunk.mutated``: relations it
        has updated, deleted from or truncated (their tables' staging could not be used)."""
        if self.stage_bytes <= 0:
            return
        xid, end, relation_ids = chunk.xid, chunk.end, chunk.relation_ids
        state = self._open.setdefault(xid, _Open())
        start = state.pieces[-1].segment.end if state.pieces else 0
        size = end - start
        if state.disabled or size < self.stage_bytes:
            return
        with self._lock:
            if self._inflight and self._inflight + size > self.inflight_bytes:
                return
            self._inflight += size
        # Which table each relation is: every relation the transaction changed by the
        # piece's end is described by then. A transaction whose tables cannot be staged
        # (a reload: TRUNCATE, then inserts) comes here at every chunk, each time from
        # the same start: all of this costs in its relations, not in its chunks so far.
        tables = self._tables(
            state, chunk.relations_at(end), relation_ids, frozenset(chunk.mutated)
        )
        if not tables:  # nothing here could be used: no job, and the next piece
            with self._lock:  # starts where this one would have
                self._inflight -= size
            return
        relations = chunk.relations_at(start)  # what the task starts from
        segment = SpoolSegment(chunk.path, start, end)
        prefix = f"sparkapply-staged-{uuid.uuid4().hex[:16]}-"
        tables = tuple(dataclasses.replace(t, prefix=prefix) for t in tables)
        task = StageTask(
            xid,
            segment,
            relations,
            tables,
            self.proto_version,
            self.streaming,
            storage=Storage.of(self.catalog.properties),
        )
        covered = frozenset(rid for t in tables for rid in t.relation_ids)
        future = self._pool.submit(self._run, task)
        state.pieces.append(Piece(segment, future, frozenset(relation_ids), covered))

    def truncated(self, xid: int, offset: int) -> None:
        """A subtransaction abort cut the spool of ``xid`` back to ``offset``."""
        state = self._open.get(xid)
        if state is None:
            return
        lost: list[Piece] = []
        while state.pieces and state.pieces[-1].segment.end > offset:  # costs what it drops
            lost.append(state.pieces.pop())
        self._discard(lost)

    def dropped(self, xid: int, *, for_good: bool = False) -> None:
        """Everything staged of ``xid`` is of no use (abort, prepare); ``for_good``: it
        is still being received, and nothing more of it is staged (DDL inside it)."""
        state = self._open.pop(xid, None)
        if state is not None:
            self._discard(state.pieces)
        if for_good:
            self._open[xid] = _Open(disabled=True)

    def committed(
        self, xid: int, path: str, end: int, relations_at: RelationsAt
    ) -> StagedWork | None:
        state = self._open.pop(xid, None)
        if state is None or not state.pieces or state.disabled:
            return None
        return StagedWork(xid, path, end, state.pieces, relations_at)

    # -- two-phase ---------------------------------------------------------------------

    def holds(self, xid: int) -> bool:
        """True if ``xid`` has pieces that a STREAM PREPARE would keep."""
        state = self._open.get(xid)
        return state is not None and bool(state.pieces) and not state.disabled

    def prepared(self, xid: int, path: str) -> bool:
        """STREAM PREPARE of ``xid``: keep its pieces for COMMIT PREPARED, also across a
        restart (a record beside the prepared store's entry, written once every piece
        has finished; until then a restart sweeps them and the commit reads the spool).
        True: pieces read the spool file ``path``; this removes it once they are done,
        so the prepared store must already hold its own link or copy of it."""
        if not self.holds(xid):
            self._open.pop(xid, None)
            return False
        state = self._open.pop(xid)
        with self._prepare_lock:
            self._preparing[xid] = state.pieces
        self._pool.submit(self._persist_prepared, xid, state.pieces, path)
        return True

    def commit_prepared(
        self, xid: int, path: str, end: int, relations: tuple[m.Relation, ...]
    ) -> StagedWork | None:
        """COMMIT PREPARED of ``xid``, whose spool is now ``path`` (same offsets)."""
        record = self._record(xid)
        with self._prepare_lock:
            pieces = self._preparing.pop(xid, None)
        if pieces is None:
            pieces = _recorded(record)
        if not pieces:
            return None
        return StagedWork(xid, path, end, pieces, lambda _offset: relations, record=record)

    def rolled_back(self, xid: int) -> None:
        """ROLLBACK PREPARED of ``xid``: its staged files go."""
        record = self._record(xid)
        with self._prepare_lock:
            pieces = self._preparing.pop(xid, None)
        if pieces is None:
            pieces = _recorded(record) or []
        self._discard(pieces)
        record.unlink(missing_ok=True)

    def _record(self, xid: int) -> Path:
        return staged_record(self.prepared_dir, xid)

    def _persist_prepared(self, xid: int, pieces: list[Piece], path: str) -> None:
        results = [outcome(p.future, xid) for p in pieces]
        remove_spool_file(path)  # the prepared store holds the spool under its own name
        with self._prepare_lock:
            if self._preparing.get(xid) is not pieces:
                return  # committed or rolled back meanwhile: that path owns the files
            if any(r.error is not None for r in results):
                self._preparing.pop(xid)
                self._discard(pieces)
                return
            recorded = [
                RecordedPiece(p.segment.start, p.segment.end, p.touched, p.covered, tuple(r.tables))
                for p, r in zip(pieces, results, strict=True)
            ]
            write_record(self._record(xid), xid, recorded)
        for result in results:
            forget_journal(result)  # the record keeps the files from the sweep now

    def close(self) -> None:
        """At a session's end. Pieces in flight finish (at most the in-flight budget),
        so that prepared transactions get their records; those of transactions still
        open are deleted, and what a crash would leave is swept at the next start."""
        for state in self._open.values():
            self._discard(state.pieces)
        self._open.clear()
        self._pool.shutdown(wait=True)

    # -- pieces ------------------------------------------------------------------------------

    def _tables(
        self,
        state: _Open,
        relations: tuple[m.Relation, ...],
        relation_ids: Sequence[int],
        mutated: frozenset[int],
    ) -> tuple[StageTable, ...]:
        by_id = {r.relation_id: r for r in relations}
        groups: dict[TableIdent, set[int]] = {}
        for rid in relation_ids:
            rel = by_id.get(rid)
            if rel is not None:
                groups.setdefault(self.identifier(rel), set()).add(rid)
        out = []
        for ident, rids in sorted(groups.items()):
            keys = _key_of([by_id[rid] for rid in sorted(rids)])
            changed = bool(rids & mutated)
            if changed and not keys:
                continue  # updates without a key to net them by: applied from the spool
            if ident not in state.tables:
                state.tables[ident] = self._describe(ident, frozenset(rids))
            table = state.tables[ident]
            if table is not None:
                out.append(
                    StageTable(
                        table.name,
                        frozenset(rids),
                        table.schema,
                        table.schema_id,
                        table.data_dir,
                        key_names=keys,
                        mutated=changed,
                    )
                )
        return tuple(out)

    def _describe(self, ident: TableIdent, rids: frozenset[int]) -> StageTable | None:
        try:
            table = self.catalog.load_table(ident)
        except Exception as exc:  # not created yet (its first batch creates it): not staged
            log.debug("not staging %s: %s", ".".join(ident), type(exc).__name__)
            return None
        return StageTable(
            ".".join(ident),
            rids,
            arrow_schema_of(table),
            table.schema().schema_id,
            data_directory(table),
        )

    def _run(self, task: StageTask) -> StageResult:
        journal = None
        try:
            if task.tables:  # before it writes: a restart finds its files, wherever it stopped
                journal = write_journal(self.journal_dir, task)
            result = self._job(task)
            result.journal = journal
            failpoint("piece-staged")
            return result
        except Exception as exc:  # a failed piece costs speed, never data
            error = SparkapplyError(f"staging job failed: {exc}", xid=task.xid)
            return StageResult(error=error, journal=journal)
        finally:
            with self._lock:
                self._inflight -= task.segment.nbytes

    def _job(self, task: StageTask) -> StageResult:
        sc = self.spark.sparkContext
        sc.setJobGroup(f"sparkapply-stage-{task.xid}", "stage a streamed chunk", False)
        results: list[StageResult] = sc.parallelize([task], 1).map(run_stage_task).collect()
        return results[0]

    def _discard(self, pieces: Sequence[Piece]) -> None:
        for piece in pieces:
            piece.future.add_done_callback(self._forget)

    @staticmethod
    def _forget(fut: Future[StageResult]) -> None:
        with contextlib.suppress(Exception):
            result = fut.result()
            delete_files([f for t in result.tables for f in t.written()])
            if result.error is None:  # else the files are unknown: the next start sweeps
                forget_journal(result)


def _key_of(relations: Sequence[m.Relation]) -> tuple[str, ...]:
    """The key a table's changes are netted by, if its relations agree on one (none
    for REPLICA IDENTITY FULL or no identity: only its inserts can be staged)."""
    keys = {
        () if r.replica_identity == "f" else tuple(c.name for c in r.columns if c.is_key)
        for r in relations
    }
    return keys.pop() if len(keys) == 1 else ()


def _recorded(record: Path) -> list[Piece] | None:
    """The pieces a prepared transaction's staging record describes, already done."""
    recorded = read_record(record)
    if recorded is None:
        return None
    pieces = []
    for r in recorded:
        fut: Future[StageResult] = Future()
        fut.set_result(StageResult(tables=list(r.tables)))
        pieces.append(Piece(SpoolSegment("", r.start, r.end), fut, r.touched, r.covered))
    return pieces
