"""The stager as ``changes/`` sees it: what it is told, and what it hands back.

The stager (``staging/stager.py``) stages a streamed transaction's pieces while the
transaction is still arriving. ``changes/`` does not import it: the assembler talks to
a :class:`StreamStager`, telling it of each :class:`ClosedChunk`, and a committed
transaction carries the stager's result as an opaque :class:`Staged` that only the
apply opens. ``staging/``'s ``Stager`` and ``StagedWork`` satisfy these protocols
structurally (mypy checks it where the subscriber hands the one to the assembler).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from sparkapply.changes.spool import SpoolSegment
from sparkapply.pgoutput import messages as m

RelationsAt: TypeAlias = Callable[[int], tuple[m.Relation, ...]]
"""The relation cache entries a streamed transaction had in effect at a spool offset."""

PieceFiles: TypeAlias = tuple[tuple[str, ...], str | None]
"""One staged piece of a keyed table: its data files (the piece's final rows) and its
removes file (the keys of the pre-transaction rows it replaces), if any."""


@dataclass(frozen=True, slots=True)
class ClosedChunk:
    """A streamed transaction's spool has grown to ``end`` (a chunk closed, or enough
    was spooled within one): what the stager is told."""

    xid: int
    path: str  # the transaction's stream spool
    end: int
    relation_ids: Sequence[int]  # every relation the transaction has changed so far
    relations_at: RelationsAt
    mutated: Sequence[int] = ()  # of those, updated, deleted from or truncated


class StagedShare(Protocol):
    """What the apply takes from staging for one table of one transaction."""

    @property
    def files(self) -> tuple[str, ...]: ...  # staged data files, committed as they are

    @property
    def rows(self) -> int: ...

    @property
    def changes(self) -> int: ...  # source row changes: inserts, updates, deletes

    @property
    def updates(self) -> int: ...

    @property
    def deletes(self) -> int: ...

    @property
    def remainder(self) -> tuple[SpoolSegment, ...]: ...  # the spool still to read

    @property
    def relations(self) -> tuple[m.Relation, ...]: ...  # in effect where it starts

    @property
    def keyed(self) -> tuple[PieceFiles, ...]: ...  # empty: the files only insert


class Staged(Protocol):
    """The staging of one committed streamed transaction (``CommittedTxn.staged``).

    Contract: the apply asks :meth:`use` per table while it plans the batch, and calls
    :meth:`finish` once the batch is committed (never before: the files :meth:`use`
    returned must outlive the commit that references them).
    """

    def use(
        self, table: str, relation_ids: frozenset[int], schema_id: int, *, keyed: bool = False
    ) -> StagedShare | None:
        """The staged files of ``table`` if the apply may commit them as they are
        (``keyed``: also pieces that update or delete, whose removes the apply
        locates; the transaction is then the batch's only one on the table)."""
        ...

    def finish(self, used: set[str]) -> None:
        """The batch is committed: delete the staged files it did not use."""
        ...


class StreamStager(Protocol):
    """Where streamed chunks go as they close; the assembler tells it what the spool of
    each streamed transaction becomes."""

    stage_bytes: int  # also offered a piece within a chunk, every this many bytes

    def chunk_closed(self, chunk: ClosedChunk) -> None: ...

    def truncated(self, xid: int, offset: int) -> None: ...

    def dropped(self, xid: int, *, for_good: bool = False) -> None: ...

    def committed(
        self, xid: int, path: str, end: int, relations_at: RelationsAt
    ) -> Staged | None: ...

    def holds(self, xid: int) -> bool: ...

    def prepared(self, xid: int, path: str) -> bool: ...

    def commit_prepared(
        self, xid: int, path: str, end: int, relations: tuple[m.Relation, ...]
    ) -> Staged | None: ...

    def rolled_back(self, xid: int) -> None: ...
