"""What staging hands the apply: a committed streamed transaction's pieces (StagedWork),
and for each table the staged files it may commit as they are (StagedUse). Driver side;
how the pieces come to be is ``stager.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from sparkapply.changes.spool import SpoolSegment
from sparkapply.changes.staged import PieceFiles
from sparkapply.errors import SparkapplyError
from sparkapply.pgoutput import messages as m
from sparkapply.staging.piece import StageResult
from sparkapply.staging.records import delete_files, forget_journal

log = logging.getLogger(__name__)


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
    changes: int  # source row changes, of which:
    updates: int
    deletes: int  # (the rest are inserts)
    remainder: tuple[SpoolSegment, ...]  # the spool still to read
    relations: tuple[m.Relation, ...]  # the descriptions in effect where it starts
    # Asked for keyed (the apply composes the pieces): every piece's files, in order,
    # for the task to locate the removes and check the pieces compose
    # (apply/fold/staged.py). Empty: the files only insert, committed as they are.
    keyed: tuple[PieceFiles, ...] = ()


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
            results = [outcome(p.future, self.xid) for p in self.pieces]
            errors = [r.error for r in results if r.error is not None]
            if errors:
                log.warning(
                    "staging of xid %s failed, applying it from the spool: %s", self.xid, errors[0]
                )
                self._failed = True
            self._results = results
        return None if self._failed else self._results

    def use(
        self, table: str, relation_ids: frozenset[int], schema_id: int, *, keyed: bool = False
    ) -> StagedUse | None:
        """The staged files of ``table`` if the apply may commit them as they are;
        with ``keyed``, also pieces that update or delete it (see :class:`StagedUse`)."""
        for piece in self.pieces:
            if not (relation_ids & piece.touched) <= piece.covered:
                return None  # a piece did not stage the table (it did not exist yet)
        results = self._wait()
        if not results:
            return None
        files: list[str] = []
        parts: list[PieceFiles] = []
        rows = changes = updates = deletes = 0
        for result in results:
            for staged in result.tables:
                if staged.table != table:
                    continue
                if staged.mutated or staged.schema_id != schema_id:
                    return None
                if staged.keyed and not keyed:
                    return None
                files += staged.files
                parts.append((tuple(staged.files), staged.removes))
                rows += staged.rows
                changes += staged.changes
                updates += staged.updates
                deletes += staged.deletes
        start = self.staged_end
        remainder = (SpoolSegment(self.path, start, self.end),) if self.end > start else ()
        return StagedUse(
            tuple(files),
            rows,
            changes,
            updates,
            deletes,
            remainder,
            self.relations_at(start),
            # Asked for keyed, even inserting pieces are composed: the remainder may
            # update what they inserted.
            keyed=tuple(parts) if keyed else (),
        )

    def finish(self, used: set[str]) -> None:
        """The transaction's batch is committed: delete the staged files it did not
        use, and the journal."""
        results = self.results()
        delete_files([f for r in results for t in r.tables for f in t.written() if f not in used])
        for result in results:
            forget_journal(result)
        if self.record is not None:
            self.record.unlink(missing_ok=True)


def outcome(future: Future[StageResult], xid: int) -> StageResult:
    """A piece's result; one that never finished counts as failed."""
    try:
        return future.result()
    except Exception as exc:  # cancelled at a session's end: the batch is not applied
        return StageResult(error=SparkapplyError(f"staging did not finish: {exc!r}", xid=xid))
