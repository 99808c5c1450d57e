"""Requested cuts: LSNs an operator (or ``verify``) asked the running mirror to cut at.

``sparkapply cut --at-lsn X`` writes an empty file ``<work_dir>/cut-requests/<X>``
(X as 16 hex digits, so names sort as LSNs). The running subscriber's scheduler ends
a batch after the last transaction whose commit LSN is at most X, and once it knows
no further transaction at or below X can come (the next one is above X, or the stream
is idle past X) the apply records a cut at exactly X and removes the file. A request
left by a stopped ``run`` is served by the next one; a request the mirror is already
past (tables hold transactions above X) is dropped with a warning: no exact cut at X
can be made any more.

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
from sparkapply.state.layout import cut_request_lsn, cut_request_name, cut_requests_dir


class CutRequests:
    """The requests under ``<work_dir>/cut-requests/``; the subscriber re-reads the
    directory at most every ``interval`` seconds."""

    def __init__(self, work_dir: Path, *, interval: float = 0.2) -> None:
        self.root = cut_requests_dir(work_dir)
        self.interval = interval
        self._read_at = float("-inf")
        self._pending: list[Lsn] = []

    def add(self, lsn: Lsn) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / cut_request_name(lsn)).touch()
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
            self._pending = self._read()
        return self._pending

    def _read(self) -> list[Lsn]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            try:
                out.append(Lsn(cut_request_lsn(name)))
            except ValueError:  # not ours
                continue
        return sorted(out)

    def done(self, lsn: Lsn) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / cut_request_name(lsn))
        self._pending = [p for p in self._pending if p != lsn]
