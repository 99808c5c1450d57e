"""Maintenance beside the apply: its own thread and its own Spark scheduler pool.

A committed batch is acknowledged at once and the next batch starts at once, whatever
maintenance is doing: compaction, manifest merges and expiry run on this thread, their
Spark jobs in the ``maintenance`` pool (the session schedules pools fairly, so apply
tasks do not queue behind a compaction's), and each of their commits holds the
table's lock (``sink/locks.py``) so that it never lands between an apply's planning
and its commit. One run at a time: a run is started after a batch when none is
running; a table whose thresholds are still exceeded is looked at again next time.
The apply's own expiry (``[sink] retain_snapshots``) runs here too, first, when the
apply asks for it (:meth:`BackgroundMaintenance.expire_later`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from sparkapply.maintain.maintainer import Maintainer, MaintenanceReport
from sparkapply.sink.tables import TableIdentifier

log = logging.getLogger(__name__)

# Runs start at most this often (the apply's expiry excepted). A run reads every
# table's snapshot summary and manifest list in this process, beside the apply's own
# Python work on two cores; after every batch, at two batches a second, maintenance
# ran without pause and slowed the apply's planning and commits by half. Thresholds
# crossed meanwhile wait this long at most.
MIN_SECONDS_BETWEEN_RUNS = 5.0


class BackgroundMaintenance:
    def __init__(
        self,
        maintainer: Maintainer,
        tables: Callable[[], Sequence[TableIdentifier]],
        *,
        retain_snapshots: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.maintainer = maintainer
        self.tables = tables
        # The apply's own expiry ([sink] retain_snapshots), asked for by the apply.
        self.retain_snapshots = retain_snapshots
        self._expiry_due: set[TableIdentifier] = set()
        self._guard = threading.Lock()
        self._clock = clock
        self._started = float("-inf")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkapply-maintain")
        self._running: Future[list[MaintenanceReport]] | None = None
        self.runs = 0  # runs finished (for tests and status)

    def poke(self) -> None:
        """Start a run unless one is running; re-raises what a finished run raised
        (a failed step is logged by the maintainer; only a bug arrives here)."""
        if self._running is not None:
            if not self._running.done():
                return
            self._finish()
        now = self._clock()
        with self._guard:
            expiry_due = bool(self._expiry_due)
        if now - self._started < MIN_SECONDS_BETWEEN_RUNS and not expiry_due:
            return
        self._started = now
        self._running = self._pool.submit(self._run)

    def _finish(self) -> None:
        assert self._running is not None
        running, self._running = self._running, None
        running.result()
        self.runs += 1

    def expire_later(self, ident: TableIdentifier) -> None:
        """The apply found ``ident`` over its snapshot count: expire it on the next run
        (thread-safe)."""
        with self._guard:
            self._expiry_due.add(ident)

    def _run(self) -> list[MaintenanceReport]:
        with self._guard:
            due, self._expiry_due = sorted(self._expiry_due), set()
        for ident in due:
            self.maintainer.expire_excess(ident, retain_last=self.retain_snapshots)
        return self.maintainer.run_due(self.tables())

    def close_run(self) -> None:
        """Wait for the run in progress, if any (tests)."""
        if self._running is not None:
            self._finish()

    def close(self) -> None:
        """Wait for the run in progress (a kill at any point is safe; a clean stop
        lets it finish) and stop the thread."""
        try:
            if self._running is not None:
                self._finish()
        finally:
            self._pool.shutdown(wait=True)
