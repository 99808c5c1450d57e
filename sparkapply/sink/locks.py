"""Which writer may commit to a table now: the apply, or maintenance beside it.

The apply plans a table's batch against its current snapshot and commits on exactly
that snapshot; maintenance (compaction, manifest merge, expiry) runs on its own
thread at the same time and commits snapshots or metadata of its own. Either commit
landing between the other's planning and commit would refuse the later one. So:

- the apply holds the locks of a batch's tables from planning to commit (a batch
  never waits for maintenance's *work*, only for a commit in flight, which is short);
- maintenance does its work unlocked and takes the lock only around a commit
  (:meth:`TableLocks.committing`); a commit that finds the table moved is refused
  as today, and tried again at a later run;
- a table maintenance committed to is reported to the apply the next time it takes
  the lock, so that it drops what it cached of the table and plans afresh.

Locks are taken in one order (sorted identifiers), so two holders never deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

TableIdent = tuple[str, str]  # (namespace, table)


class TableLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[TableIdent, threading.Lock] = {}
        self._changed: set[TableIdent] = set()
        # Told of each commit another writer made (the cut log: sink/cuts.py).
        self.listeners: list[Callable[[TableIdent], None]] = []

    def _lock(self, ident: TableIdent) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(ident, threading.Lock())

    @contextmanager
    def hold(self, idents: Iterable[TableIdent]) -> Iterator[set[TableIdent]]:
        """Hold every table of ``idents``; yields those another writer committed to
        since the last holder looked (drop what is cached of them)."""
        locks = [self._lock(i) for i in sorted(set(idents))]
        for lock in locks:
            lock.acquire()
        try:
            with self._guard:
                changed = self._changed.intersection(idents)
                self._changed -= changed
            yield changed
        finally:
            for lock in reversed(locks):
                lock.release()

    @contextmanager
    def committing(self, ident: TableIdent) -> Iterator[None]:
        """Hold ``ident`` around one commit of another writer (maintenance); the
        table counts as changed unless the commit raised."""
        with self._lock(ident):
            yield
            with self._guard:
                self._changed.add(ident)
            for listener in self.listeners:
                listener(ident)

    def changed(self) -> set[TableIdent]:
        """Tables committed to since the last :meth:`hold` that looked (for tests)."""
        with self._guard:
            return set(self._changed)
