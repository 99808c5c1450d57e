"""The copy's commit: every table of one copy, and the cut it makes.

Each copied table becomes one Iceberg snapshot that replaces its rows, stamped C - 1
(``driver.py``, THE HAND-OVER). Where the catalog commits several tables at once
(``sink/atomic.py``) the tables of the initial copy commit in one catalog
transaction, with the copy's cut; otherwise, and for later copies (the driver says
why), one after another, the cut last.

THE CUT A COPY MAKES

A copy at a point C holds, in every table it copied, exactly the transactions
committed below C: a cut at C - 1 (``sink/cuts.py``), if every other mirrored table
holds exactly those too.

- The initial copy (every published table from the slot's own snapshot, where
  streaming starts) is such a cut by itself: it is recorded with the copy, so a
  freshly copied mirror has a cut before its first batch, also on a publisher where
  nothing changes.
- A copy from a temporary slot (a table added to the publication, created again, a
  column that arrived with values, a resync, the tables a killed copy left) is taken
  at a point past what the stream has applied: the other tables do not hold the
  transactions between. Its cut is asked of the stream instead, as ``sparkapply cut
  --at-lsn C - 1`` asks (``changes/cut_requests.py``): the apply records it once every
  transaction up to it is applied and none after, also when the publisher is idle;
  until then the copied table is left out of the cuts (its applied LSN is past them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.catalog import Catalog

from sparkapply.copy.job import PlannedTable
from sparkapply.errors import CommitOutcomeUnknownError, SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.lsn import Lsn
from sparkapply.sink.atomic import commit_together
from sparkapply.sink.commit import StagedSnapshot, commit_staged, stage_files
from sparkapply.sink.cuts import Cut, CutLog
from sparkapply.sink.files import remove_orphans

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CopiedTable:
    """A table whose slices all wrote their files."""

    planned: PlannedTable
    files: list[str]
    rows: int


@dataclass(frozen=True, slots=True)
class CopyCommit:
    """How one copy commits: at ``lsn`` (the slot's consistent point C), each table
    stamped C - 1; ``atomic``: in one catalog transaction; ``cuts``: record the cut
    at C - 1 with it (the initial copy only, see the module doc)."""

    catalog: Catalog
    lsn: Lsn
    atomic: bool
    cuts: CutLog | None = None

    @property
    def stamp(self) -> Lsn:
        return Lsn(self.lsn - 1)

    def commit(
        self, copied: Sequence[CopiedTable]
    ) -> tuple[list[CopiedTable], list[SparkapplyError]]:
        """Commit ``copied``: those committed, and an error (naming its table) for
        each that did not, whose files are then removed."""
        staged: list[tuple[CopiedTable, StagedSnapshot]] = []
        errors: list[SparkapplyError] = []
        for one in copied:
            try:
                staged.append((one, self._stage(one)))
            except SparkapplyError as exc:
                self._failed(one, exc, errors)
        if not staged:
            return [], errors
        if self.atomic:
            return self._together(staged, errors), errors
        done = self._one_by_one(staged, errors)
        if done:  # after every table, as a batch's cut: naming those committed
            self._commit_cut([s for one, s in staged if any(one is d for d in done)])
        return done, errors

    def _stage(self, one: CopiedTable) -> StagedSnapshot:
        p = one.planned
        return stage_files(
            p.table,
            added=one.files,
            truncate=True,
            lsn=self.stamp,
            base_snapshot_id=p.base_snapshot,
            extra_summary={
                "sparkapply.copy-lsn": str(self.lsn),
                "sparkapply.copy-rows": str(one.rows),
            },
        )

    @staticmethod
    def _failed(one: CopiedTable, exc: SparkapplyError, errors: list[SparkapplyError]) -> None:
        if not isinstance(exc, CommitOutcomeUnknownError):  # else the files may be live
            remove_orphans(one.planned.table, one.files)
        errors.append(exc.with_context(table=one.planned.source.qualified))

    def _stage_cut(self, staged: list[StagedSnapshot]) -> tuple[StagedSnapshot, Cut] | None:
        if self.cuts is None:
            return None
        return self.cuts.stage(staged, lsn=self.stamp, committed_at=None)

    def _together(
        self, staged: list[tuple[CopiedTable, StagedSnapshot]], errors: list[SparkapplyError]
    ) -> list[CopiedTable]:
        tables = [s for _, s in staged]
        cut = None
        try:
            cut = self._stage_cut(tables)
            commit_together(self.catalog, tables + ([cut[0]] if cut else []))
        except SparkapplyError as exc:
            for one, _ in staged:
                self._failed(one, exc, errors)
            return []
        if cut is not None:
            assert self.cuts is not None
            self.cuts.committed(tables, cut[1])
        for _ in staged:  # every table committed at once: a kill here finds them all
            failpoint("copy-after-table-commit")
        return [one for one, _ in staged]

    def _one_by_one(
        self, staged: list[tuple[CopiedTable, StagedSnapshot]], errors: list[SparkapplyError]
    ) -> list[CopiedTable]:
        done = []
        for one, snapshot in staged:
            try:
                commit_staged(snapshot)
            except SparkapplyError as exc:
                self._failed(one, exc, errors)
                continue
            done.append(one)
            failpoint("copy-after-table-commit")
        return done

    def _commit_cut(self, tables: list[StagedSnapshot]) -> None:
        """The cut of tables committed one by one. Not recorded, the first batch
        records one: the copy stands."""
        try:
            cut = self._stage_cut(tables)
            if cut is None:
                return
            commit_staged(cut[0])
        except SparkapplyError as exc:
            log.warning("the copy's cut was not recorded (%s); the first batch records one", exc)
            return
        assert self.cuts is not None
        self.cuts.committed(tables, cut[1])
