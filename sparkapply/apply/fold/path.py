"""Which fold a table task takes: one function decides, as PostgreSQL's
``get_transaction_apply_action`` (``worker.c``) decides how a transaction is applied.

:func:`choose_path` answers from what the driver planned (the table's identity, and
whether the batch only inserts into it). A vectorised fold that meets what it cannot
net raises :class:`NeedsRowFold`, saying why, and the task falls back to the row-wise
fold: the one way a path changes after it was chosen.
"""

from __future__ import annotations

import enum
from typing import Protocol

from sparkapply.changes.staged import PieceFiles
from sparkapply.plan.batch import Identity


class FoldPath(enum.Enum):
    """How a task turns its transactions into files."""

    INSERT_ONLY = "insert-only"  # only inserts: decode straight into data files (append)
    KEYED = "keyed"  # net effect per key, vectorised (keyed)
    FULL = "full"  # REPLICA IDENTITY FULL: net effect per row image (full)
    ROW_WISE = "row-wise"  # change by change (rowwise): what the others cannot net
    # A streamed transaction's pieces, netted by key while it arrived, composed with
    # the fold of the rest of its spool (staged)
    STAGED_KEYED = "staged-keyed"


class NeedsRowFold(Exception):
    """The batch has what only the row-wise fold handles (unchanged TOAST values, or a
    key made of other columns in another relation version)."""


class PlannedTask(Protocol):
    """What :func:`choose_path` reads of a table task."""

    @property
    def insert_only(self) -> bool: ...

    @property
    def identity(self) -> Identity: ...

    @property
    def staged(self) -> tuple[PieceFiles, ...]: ...


def choose_path(task: PlannedTask) -> FoldPath:
    """The path a task takes first. A keyed or full fold that meets what it cannot
    net (a key that moves and comes back, an identity that changes mid-transaction:
    the fold raises :class:`NeedsRowFold` saying why) leaves it to the row-wise fold;
    staged pieces that do not compose leave the transaction to the driver, which
    applies it from the spool (``fold/staged.py``)."""
    if task.staged:
        return FoldPath.STAGED_KEYED
    if task.insert_only:
        return FoldPath.INSERT_ONLY
    if task.identity == "key":
        return FoldPath.KEYED
    if task.identity == "full":
        return FoldPath.FULL
    return FoldPath.ROW_WISE
