"""What the ``run`` of a work_dir is doing, for ``status`` and health checks.

``run`` writes ``run.json`` (state/layout.py) when its state changes (starting,
streaming, retrying after a transient error, stopped, failed) and at most every
:data:`BATCH_NOTE_INTERVAL` seconds as batches complete, so that ``status`` (another
process) can say whether a mirror is alive and, while it retries, what failed and
since when. The error text is the error's own message, which never holds a secret
(errors name servers as host:port/db as user).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from sparkapply.state.durable import write_json_durably
from sparkapply.state.layout import run_file

State = Literal["starting", "streaming", "retrying", "stopped", "failed"]
BATCH_NOTE_INTERVAL = 10.0


@dataclass(frozen=True, slots=True)
class RunState:
    pid: int
    host: str
    state: State
    since: float  # epoch seconds: when this state began
    started: float  # epoch seconds: when the run began
    last_batch: float | None = None  # epoch seconds of the last completed batch
    error: str | None = None  # retrying / failed: what failed (its first line)
    attempts: int = 0  # retrying: sessions that failed in a row

    def alive(self) -> bool:
        """The process that wrote it still runs (a process on another host is
        taken to, while its state is not final)."""
        if self.state in ("stopped", "failed"):
            return False
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class RunStateFile:
    """The writer ``run`` holds: one file, replaced whole (readers never see half)."""

    def __init__(self, work_dir: Path) -> None:
        self.path = run_file(work_dir)
        now = time.time()
        self.current = RunState(os.getpid(), socket.gethostname(), "starting", now, now)
        self._noted = 0.0

    def enter(self, state: State, error: str | None = None) -> None:
        attempts = self.current.attempts + 1 if state == "retrying" else 0
        since = self.current.since if state == self.current.state == "retrying" else time.time()
        self._write(replace(self.current, state=state, since=since, error=error, attempts=attempts))

    def batch_done(self) -> None:
        now = time.time()
        self.current = replace(self.current, last_batch=now)
        if now - self._noted >= BATCH_NOTE_INTERVAL:
            self._write(self.current)

    def _write(self, state: RunState) -> None:
        self.current = state
        self._noted = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_durably(self.path, asdict(state), sync_dir=False)


def read_run_state(work_dir: Path) -> RunState | None:
    try:
        doc = json.loads(run_file(work_dir).read_text())
        return RunState(**doc)
    except (OSError, ValueError, TypeError):  # none yet, or being replaced
        return None
