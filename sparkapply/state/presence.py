"""Whether a ``run`` lives on a ``work_dir``: a run holds a shared lock (``flock``) on
``work_dir/run.lock`` for its whole life, which the kernel releases when the process
ends, also when it is killed. ``verify`` reads it to tell a run between two sessions
(the slot idle for a reconnect's backoff) from no run at all: it must not take the
slot from the first, and need not wait for the second.

The file itself is left in place (empty): removing it would race with a run taking it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from sparkapply.errors import StateError
from sparkapply.state.layout import run_lock


def _open(work_dir: Path) -> int:
    path = run_lock(work_dir)
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StateError(
            f"cannot open {path}: {exc}", hint=f"check that {work_dir} is writable"
        ) from exc


@contextlib.contextmanager
def living(work_dir: Path) -> Iterator[None]:
    """Held for as long as a run lives (shared: two runs do not wait for each other
    here; the slot refuses the second)."""
    fd = _open(work_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def run_alive(work_dir: Path) -> bool:
    """Whether a run (in any process, this one included) holds the lock now."""
    fd = _open(work_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
