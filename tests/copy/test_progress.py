"""Copy progress: read from pg_stat_progress_copy, as log lines or as rich bars."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from sparkapply.copy.progress import CopyProgress

pytestmark = pytest.mark.integration

PREFIX = "sparkapply-copy test:"


def _slow_copy(dsn: str, tag: str, rows: int) -> None:
    """A COPY that takes a second or two, under the application_name a slice uses."""
    with (
        psycopg.connect(dsn, autocommit=True, application_name=tag) as conn,
        conn.cursor().copy(
            f"COPY (SELECT g, pg_sleep(0.0005) FROM generate_series(1, {rows}) g) TO STDOUT"
        ) as copy,
    ):
        for _ in copy:
            pass


def test_log_lines_when_not_on_a_terminal(pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sparkapply.copy.progress")
    tag = PREFIX + "0"
    progress = CopyProgress(
        pg_dsn,
        PREFIX,
        {tag: "public.t"},
        {"public.t": 2000},
        interval=0.1,
        log_interval=0.2,
        tty=False,
    )
    with progress:
        worker = threading.Thread(target=_slow_copy, args=(pg_dsn, tag, 2000))
        worker.start()
        worker.join()
        progress.table_done("public.t", 2000, 9000, 1.5)
    running = [r.getMessage() for r in caplog.records if r.getMessage().startswith("copying")]
    assert running, "no progress line while the COPY ran"
    assert "of ~2,000 rows" in running[-1] and "rows/s" in running[-1]
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("copied")]
    assert done == ["copied public.t: 2,000 rows, 0.0 MB in 1.5 s (1,333 rows/s)"]


def test_bars_on_a_terminal(pg_dsn: str) -> None:
    tag = PREFIX + "1"
    seen: list[float] = []
    progress = CopyProgress(
        pg_dsn, PREFIX, {tag: "public.u"}, {"public.u": -1}, interval=0.1, tty=True
    )
    with progress:
        worker = threading.Thread(target=_slow_copy, args=(pg_dsn, tag, 2000))
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            seen.append(progress._bar.tasks[0].completed)
        progress.table_done("public.u", 2000, 9000, 1.5)
        task = progress._bar.tasks[0]
        assert task.completed == task.total == 2000
    assert max(seen) > 0, "the bar never moved while the COPY ran"
