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
    apply would have written exactly it. At apply time, for a table of the transaction:
    the batch appends only to it (no transaction of the batch updates, deletes or
    truncates it), every piece that touched it holds only inserts, and the table's
    schema is still the one the files were written in. Then the pieces' files are
    committed as they are, and only the spool after the last piece (the *remainder*)
    is read; when nothing remains, no Spark job runs at all. Otherwise the files are
    deleted and the whole transaction is applied from the spool.

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
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sparkapply.apply.stage import (
    StagedFiles,
    StageResult,
    StageTable,
    StageTask,
    run_stage_task,
)
from sparkapply.apply.writer import filesystem
from sparkapply.changes.spool import SpoolSegment, remove_spool_file
from sparkapply.errors import SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.pgoutput import messages as m
from sparkapply.sink.arrow import arrow_schema_of
from sparkapply.sink.maintenance import list_files, unreferenced
from sparkapply.sink.tables import data_directory
from sparkapply.workdir import prepared_dir

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

TableIdent = tuple[str, str]


@dataclass(slots=True)
class Piece:
    segment: SpoolSegment
    future: Future[StageResult]
    touched: frozenset[int]  # relation ids the transaction had changed by the piece's end
    covered: frozenset[int]  # those of tables the piece stages


@dataclass(frozen=True, slots=True)
class StagedUse:
    """What the apply takes from staging for one table of one transaction."""

    files: tuple[str, ...]
    rows: int
    changes: int
    remainder: tuple[SpoolSegment, ...]  # the spool still to read
    relations: tuple[m.Relation, ...]  # the descriptions in effect where it starts


@dataclass(slots=True)
class StagedWork:
    """The staging of one committed streamed transaction, handed to the apply."""

    xid: int
    path: str
    end: int  # the transaction's spool end
    pieces: list[Piece]
    relations_at: Callable[[int], tuple[m.Relation, ...]]
    record: Path | None = None  # a prepared transaction's staging record
    _results: list[StageResult] | None = field(default=None, init=False)
    _failed: bool = field(default=False, init=False)

    @property
    def staged_end(self) -> int:
        return self.pieces[-1].segment.end if self.pieces else 0

    def results(self) -> list[StageResult]:
        """Every piece's result, failed or not (waits for them)."""
        self._wait()
        return self._results or []

    def _wait(self) -> list[StageResult] | None:
        if self._results is None and not self._failed:
            results = [_outcome(p.future, self.xid) for p in self.pieces]
            errors = [r.error for r in results if r.error is not None]
            if errors:
                log.warning(
                    "staging of xid %s failed, applying it from the spool: %s", self.xid, errors[0]
                )
                self._failed = True
            self._results = results
        return None if self._failed else self._results

    def use(self, table: str, relation_ids: frozenset[int], schema_id: int) -> StagedUse | None:
        """The staged files of ``table`` if the apply may commit them as they are."""
        for piece in self.pieces:
            if not (relation_ids & piece.touched) <= piece.covered:
                return None  # a piece did not stage the table (it did not exist yet)
        results = self._wait()
        if not results:
            return None
        files: list[str] = []
        rows = changes = 0
        for result in results:
            for staged in result.tables:
                if staged.table != table:
                    continue
                if staged.mutated or staged.schema_id != schema_id:
                    return None
                files += staged.files
                rows += staged.rows
                changes += staged.changes
        start = self.staged_end
        remainder = (SpoolSegment(self.path, start, self.end),) if self.end > start else ()
        return StagedUse(tuple(files), rows, changes, remainder, self.relations_at(start))

    def finish(self, used: set[str]) -> None:
        """The transaction's batch is committed: delete the staged files it did not
        use, and the journal."""
        results = self.results()
        _delete_files([f for r in results for t in r.tables for f in t.files if f not in used])
        for result in results:
            _forget_journal(result)
        if self.record is not None:
            self.record.unlink(missing_ok=True)


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
        self.stage_bytes = stage_bytes
        self.inflight_bytes = inflight_bytes
        self.proto_version = proto_version
        self.streaming = streaming
        self.journal_dir = work_dir / "staging"
        self._open: dict[int, _Open] = {}
        self._lock = threading.Lock()
        self._inflight = 0
        # Each piece is one Spark job; two let one start while another finishes.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sparkapply-stage")
        self.prepared_dir = prepared_dir(work_dir)
        self._preparing: dict[int, list[Piece]] = {}  # STREAM PREPAREd, record pending
        self._prepare_lock = threading.Lock()

    # -- the assembler's side (receiving thread) ----------------------------------------

    def chunk_closed(
        self,
        xid: int,
        path: str,
        end: int,
        relation_ids: Sequence[int],
        relations_at: Callable[[int], tuple[m.Relation, ...]],
        mutated: Sequence[int] = (),
    ) -> None:
        """A chunk of ``xid`` closed with its spool at ``end``: stage what is unstaged
        if it is enough and the budget allows. ``mutated``: relations it has updated,
        deleted from or truncated (their tables' staging could not be used)."""
        if self.stage_bytes <= 0:
            return
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
        tables = self._tables(state, relations_at(end), relation_ids, frozenset(mutated))
        if not tables:  # nothing here could be used: no job, and the next piece
            with self._lock:  # starts where this one would have
                self._inflight -= size
            return
        relations = relations_at(start)  # what the task starts from
        segment = SpoolSegment(path, start, end)
        prefix = f"sparkapply-staged-{uuid.uuid4().hex[:16]}-"
        tables = tuple(dataclasses.replace(t, prefix=prefix) for t in tables)
        task = StageTask(xid, segment, relations, tables, self.proto_version, self.streaming)
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
        self, xid: int, path: str, end: int, relations_at: Callable[[int], tuple[m.Relation, ...]]
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
            pieces = _load_record(record)
        if not pieces:
            return None
        return StagedWork(xid, path, end, pieces, lambda _offset: relations, record=record)

    def rolled_back(self, xid: int) -> None:
        """ROLLBACK PREPARED of ``xid``: its staged files go."""
        record = self._record(xid)
        with self._prepare_lock:
            pieces = self._preparing.pop(xid, None)
        if pieces is None:
            pieces = _load_record(record) or []
        self._discard(pieces)
        record.unlink(missing_ok=True)

    def _record(self, xid: int) -> Path:
        return self.prepared_dir / f"{xid}.staged.json"

    def _persist_prepared(self, xid: int, pieces: list[Piece], path: str) -> None:
        results = [_outcome(p.future, xid) for p in pieces]
        remove_spool_file(path)  # the prepared store holds the spool under its own name
        with self._prepare_lock:
            if self._preparing.get(xid) is not pieces:
                return  # committed or rolled back meanwhile: that path owns the files
            if any(r.error is not None for r in results):
                self._preparing.pop(xid)
                self._discard(pieces)
                return
            doc = {
                "xid": xid,
                "pieces": [
                    {
                        "start": p.segment.start,
                        "end": p.segment.end,
                        "touched": sorted(p.touched),
                        "covered": sorted(p.covered),
                        "tables": [dataclasses.asdict(t) for t in r.tables],
                    }
                    for p, r in zip(pieces, results, strict=True)
                ],
            }
            _write_json(self._record(xid), doc)
        for result in results:
            _forget_journal(result)  # the record keeps the files from the sweep now

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
            if rids & mutated:
                continue
            if ident not in state.tables:
                state.tables[ident] = self._describe(ident, frozenset(rids))
            table = state.tables[ident]
            if table is not None:
                out.append(
                    StageTable(
                        table.name, frozenset(rids), table.schema, table.schema_id, table.data_dir
                    )
                )
        return tuple(out)

    def _describe(self, ident: TableIdent, rids: frozenset[int]) -> StageTable | None:
        try:
            table = self.catalog.load_table(ident)
        except Exception:  # not created yet (its first batch creates it): not staged
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
            if task.tables:
                journal = self._journal(task)
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

    def _journal(self, task: StageTask) -> str:
        """Before the piece writes: where its files will be, so that a restart finds
        them whatever point a crash stopped it at."""
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        path = self.journal_dir / f"{task.tables[0].prefix}{task.xid}.json"
        entries = [{"table": t.name, "dir": t.data_dir, "prefix": t.prefix} for t in task.tables]
        _write_json(path, {"xid": task.xid, "tables": entries})
        return str(path)

    def _discard(self, pieces: Sequence[Piece]) -> None:
        for piece in pieces:
            piece.future.add_done_callback(self._forget)

    @staticmethod
    def _forget(fut: Future[StageResult]) -> None:
        with contextlib.suppress(Exception):
            result = fut.result()
            _delete_files([f for t in result.tables for f in t.files])
            if result.error is None:  # else the files are unknown: the next start sweeps
                _forget_journal(result)


def _write_json(path: Path, doc: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _load_record(record: Path) -> list[Piece] | None:
    """The pieces a prepared transaction's staging record describes, already done."""
    try:
        doc = json.loads(record.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the unreadable staging record %s: %s", record, exc)
        return None
    pieces = []
    for raw in doc["pieces"]:
        fut: Future[StageResult] = Future()
        fut.set_result(StageResult(tables=[StagedFiles(**t) for t in raw["tables"]]))
        segment = SpoolSegment("", raw["start"], raw["end"])
        pieces.append(Piece(segment, fut, frozenset(raw["touched"]), frozenset(raw["covered"])))
    return pieces


def _outcome(future: Future[StageResult], xid: int) -> StageResult:
    try:
        return future.result()
    except Exception as exc:  # cancelled at a session's end: the batch is not applied
        return StageResult(error=SparkapplyError(f"staging did not finish: {exc!r}", xid=xid))


def _forget_journal(result: StageResult) -> None:
    if result.journal is not None:
        Path(result.journal).unlink(missing_ok=True)
        result.journal = None


def sweep_staged(work_dir: Path, catalog: Catalog) -> int:
    """At start: delete the files of journalled pieces that no snapshot of their table
    references, and the journal. Returns how many files were deleted."""
    root = work_dir / "staging"
    if not root.is_dir():
        return 0
    kept = {  # staged for prepared transactions, waiting for COMMIT PREPARED
        f
        for record in prepared_dir(work_dir).glob("*.staged.json")
        for piece in (_load_record(record) or [])
        for t in piece.future.result().tables
        for f in t.files
    }
    by_table: dict[str, list[str]] = {}
    entries = sorted(root.iterdir())
    for entry in entries:
        if entry.suffix != ".json":
            continue  # a journal entry half written: its piece had not started
        try:
            doc = json.loads(entry.read_text())
            for t in doc["tables"]:
                by_table.setdefault(t["table"], []).extend(_named(t["dir"], t["prefix"]))
        except (OSError, ValueError, KeyError, SparkapplyError) as exc:
            log.warning("cannot read the staging journal %s: %s", entry, exc)
    deleted = 0
    for name, files in by_table.items():
        namespace, _, table_name = name.rpartition(".")
        try:
            table = catalog.load_table((namespace, table_name))
            doomed = unreferenced(table, [f for f in files if f not in kept])
        except Exception as exc:  # the orphan sweep removes them later
            log.warning("cannot check the staged files of %s: %s", name, exc)
            continue
        _delete_files(doomed)
        deleted += len(doomed)
    for entry in entries:
        entry.unlink(missing_ok=True)
    if deleted:
        log.info("removed %d staged files of transactions that never committed", deleted)
    return deleted


def _named(data_dir: str, prefix: str) -> list[str]:
    """The files directly under ``data_dir`` whose names start with ``prefix``."""
    return [
        uri
        for uri, _size, _mtime in list_files(data_dir)
        if uri.rsplit("/", 1)[-1].startswith(prefix)
    ]


def _delete_files(uris: Sequence[str]) -> None:
    for uri in uris:
        fs, path = filesystem(uri)
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # an orphan wastes space; the orphan sweep removes it
            log.warning("cannot delete the staged file %s: %s", uri, exc)
