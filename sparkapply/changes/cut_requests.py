"""Requested cuts: LSNs an operator (or ``verify``) asked the running mirror to cut at.

``sparkapply cut --at-lsn X`` writes an empty file ``<work_dir>/cut-requests/<X>``
(X as 16 hex digits, so names sort as LSNs). The running subscriber's scheduler ends
a batch after the last transaction whose commit LSN is at most X, and once it knows
no further transaction at or below X can come (the next one is above X, or the stream
is idle past X) the apply records a cut at exactly X and removes the file. A request
left by a stopped ``run`` is served by the next one; a request the mirror is already
past (tables hold transactions above X) is dropped with a warning: no exact cut at X
can be made any more.

A request must reach the mirror before it applies a transaction above X, or no cut
at X can be made; ``verify`` cannot know X until its temporary slot is consistent,
which may take a while on a busy publisher. So it first writes a *hold*:
``hold-<F>-<until>-<pid>``, F the publisher's WAL position before the slot is
created (X will be above it). The scheduler applies nothing above F while a hold
lasts; the hold goes once the exact request is written, and a hold whose ``until``
has passed (its writer was killed) is ignored and removed. ``verify`` waits
:data:`HOLD_SETTLE` (longer than the scheduler's re-read interval) after writing the
hold before it creates the slot: a batch cut before the hold was seen holds only
transactions received before then, below X.

The files are written and removed with plain file operations; a reader in another
process tolerates one that vanishes under it.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from sparkapply.errors import StateError
from sparkapply.lsn import Lsn
from sparkapply.state.layout import (
    cut_hold_name,
    cut_hold_of,
    cut_request_lsn,
    cut_request_name,
    cut_requests_dir,
)

READ_INTERVAL = 0.2  # seconds between the subscriber's reads of the directory
HOLD_SETTLE = 3 * READ_INTERVAL  # a hold's writer waits this long before relying on it


class CutRequests:
    """The requests under ``<work_dir>/cut-requests/``; the subscriber re-reads the
    directory at most every ``interval`` seconds."""

    def __init__(self, work_dir: Path, *, interval: float = READ_INTERVAL) -> None:
        self.root = cut_requests_dir(work_dir)
        self.interval = interval
        self._read_at = float("-inf")
        self._pending: list[Lsn] = []
        self._held: Lsn | None = None

    def add(self, lsn: Lsn) -> None:
        self._touch(cut_request_name(lsn), lsn)
        # Read at the next look: a copy (on the apply thread) asks the scheduler that
        # holds this object, and its next batch must not span the request.
        self._read_at = float("-inf")

    def hold(self, floor: Lsn, seconds: float) -> Path:
        """Ask the mirror to apply nothing above ``floor`` for up to ``seconds`` (or
        until :meth:`release`); the hold's file."""
        name = cut_hold_name(floor, time.time() + seconds, os.getpid())
        self._touch(name, floor)
        return self.root / name

    @staticmethod
    def release(hold: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(hold)

    def _touch(self, name: str, lsn: Lsn) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / name).touch()
        except OSError as exc:
            raise StateError(
                f"cannot write the cut request: {exc}",
                lsn=lsn,
                hint=f"check that {self.root} is writable",
            ) from exc

    def pending(self) -> list[Lsn]:
        """The requested LSNs, lowest first (re-read at most every ``interval``)."""
        now = time.monotonic()
        if now - self._read_at >= self.interval:
            self._read_at = now
            self._pending, self._held = self._read()
        return self._pending

    def held(self) -> Lsn | None:
        """The lowest floor of the holds that last (read with :meth:`pending`)."""
        self.pending()
        return self._held

    def _read(self) -> tuple[list[Lsn], Lsn | None]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return [], None
        out = []
        floors = []
        now = time.time()
        for name in names:
            hold = cut_hold_of(name)
            if hold is not None:
                floor, until = hold
                if until > now:
                    floors.append(Lsn(floor))
                else:  # its writer died: nobody will release it
                    self.release(self.root / name)
                continue
            try:
                out.append(Lsn(cut_request_lsn(name)))
            except ValueError:  # not ours
                continue
        return sorted(out), min(floors, default=None)

    def done(self, lsn: Lsn) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / cut_request_name(lsn))
        self._pending = [p for p in self._pending if p != lsn]
