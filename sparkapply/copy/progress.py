"""Progress of a running copy: a bar per table on a terminal, log lines otherwise.

The executors do not report to the driver while they run (a Spark task's result comes
back when it ends), so the driver asks PostgreSQL: ``pg_stat_progress_copy`` shows, for
every backend running a COPY, the rows and bytes sent so far. Each copy connection
carries an ``application_name`` tag naming its slice, which ties a backend to a table.
A slice that finished keeps the last figures seen for it until the driver reports the
exact totals with :meth:`CopyProgress.table_done`. This works the same when the
executors run on other machines: only the driver and the publisher are involved.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg

from sparkapply.failpoints import armed, failpoint
from sparkapply.source.connection import session_conninfo

log = logging.getLogger(__name__)

_POLL_SQL = """
SELECT a.application_name, coalesce(p.tuples_processed, 0), coalesce(p.bytes_processed, 0)
FROM pg_stat_activity a LEFT JOIN pg_stat_progress_copy p ON p.pid = a.pid
WHERE a.application_name LIKE %s
"""


@dataclass(slots=True)
class _Table:
    name: str
    estimated_rows: int  # -1: unknown
    rows: int = 0
    bytes: int = 0
    started: float | None = None
    done: bool = False
    task: Any = None  # the rich task id
    last_logged: float = 0.0

    def rate(self, now: float) -> float:
        if self.started is None or now <= self.started:
            return 0.0
        return self.rows / (now - self.started)

    def describe(self, now: float) -> str:
        rate = self.rate(now)
        text = f"{self.rows:,} rows"
        if self.estimated_rows > 0:
            pct = min(100.0, 100.0 * self.rows / self.estimated_rows)
            text = f"{self.rows:,} of ~{self.estimated_rows:,} rows ({pct:.0f}%)"
        text += f", {self.bytes / 1e6:,.1f} MB, {rate:,.0f} rows/s"
        if rate > 0 and self.estimated_rows > self.rows:
            text += f", ETA {_clock((self.estimated_rows - self.rows) / rate)}"
        return text


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class CopyProgress:
    """Polls ``pg_stat_progress_copy`` while a copy job runs (a context manager).

    ``slices`` maps each slice's tag (the copy connection's ``application_name``) to
    its table; ``estimates`` maps tables to their estimated row counts (-1: unknown).
    """

    def __init__(
        self,
        dsn: str,
        tag_prefix: str,
        slices: Mapping[str, str],
        estimates: Mapping[str, int],
        *,
        interval: float = 0.5,
        log_interval: float = 10.0,
        tty: bool | None = None,
    ) -> None:
        self._dsn = dsn
        self._prefix = tag_prefix
        self._slices = dict(slices)
        self._tables = {name: _Table(name, est) for name, est in estimates.items()}
        self._seen: dict[str, tuple[int, int]] = {}
        # A crash test kills the copy from here while slices are read; a fast COPY may
        # finish between two polls of the normal interval.
        self._interval = 0.05 if armed("copy-progress") else interval
        self._log_interval = log_interval
        self._tty = sys.stderr.isatty() if tty is None else tty
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._started = time.monotonic()

    def __enter__(self) -> CopyProgress:
        if self._tty:
            self._bar = _rich_progress()
            for t in self._tables.values():
                t.task = self._bar.add_task(
                    t.name, total=t.estimated_rows if t.estimated_rows > 0 else None, mb=0.0
                )
            self._bar.start()
        self._thread = threading.Thread(target=self._run, name="sparkapply-copy-progress")
        self._thread.daemon = True
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._bar is not None:
            self._bar.stop()

    def table_done(self, name: str, rows: int, nbytes: int, seconds: float) -> None:
        """The exact totals of a table whose slices all finished."""
        with self._lock:
            t = self._tables.get(name)
            if t is None:
                return
            t.rows, t.bytes, t.done = rows, nbytes, True
            if self._bar is not None:
                self._bar.update(t.task, completed=rows, total=rows, mb=nbytes / 1e6)
        rate = rows / seconds if seconds > 0 else 0.0
        log.info(
            "copied %s: %s rows, %.1f MB in %.1f s (%s rows/s)",
            name,
            f"{rows:,}",
            nbytes / 1e6,
            seconds,
            f"{rate:,.0f}",
        )

    # -- polling ----------------------------------------------------------------------

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while True:
                try:
                    if conn is None or conn.closed:
                        conninfo = session_conninfo(
                            self._dsn, application_name="sparkapply-copy-progress"
                        )
                        conn = psycopg.connect(conninfo, autocommit=True)
                    rows = conn.execute(_POLL_SQL, (self._prefix + "%",)).fetchall()
                except psycopg.Error as exc:  # progress is best effort
                    log.debug("cannot read copy progress: %s", exc)
                    conn = None
                else:
                    self._update(rows)
                if self._stop.wait(self._interval):
                    break
        finally:
            if conn is not None:
                conn.close()

    def _update(self, rows: list[tuple[Any, ...]]) -> None:
        now = time.monotonic()
        running = False
        with self._lock:
            for tag, tuples, nbytes in rows:
                if tag in self._slices:
                    running = True
                    if tuples or tag not in self._seen:
                        self._seen[tag] = (int(tuples), int(nbytes))
            totals: dict[str, list[int]] = {}
            for tag, (tuples, nbytes) in self._seen.items():
                acc = totals.setdefault(self._slices[tag], [0, 0])
                acc[0] += tuples
                acc[1] += nbytes
            for name, (tuples, nbytes) in totals.items():
                t = self._tables[name]
                if t.done:
                    continue
                if t.started is None and tuples:
                    t.started = now - self._interval  # it began since the last poll
                t.rows, t.bytes = max(t.rows, tuples), max(t.bytes, nbytes)
                if self._bar is not None:
                    self._bar.update(t.task, completed=t.rows, mb=t.bytes / 1e6)
                elif t.rows and now - t.last_logged >= self._log_interval:
                    t.last_logged = now
                    log.info("copying %s: %s", name, t.describe(now))
        if running:
            failpoint("copy-progress")  # tests: killed while slices are being read


def _rich_progress() -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        ProgressColumn,
        Task,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:>10,.0f} rows/s" if speed else "     - rows/s")

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.completed:>12,.0f} rows"),
        TextColumn("{task.fields[mb]:>9,.1f} MB"),
        RateColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )
