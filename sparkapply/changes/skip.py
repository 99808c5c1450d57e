"""The skip record: one source transaction an operator asked to drop, by its finish LSN.

``sparkapply skip --lsn X/Y`` writes ``<work_dir>/skip.json``; the subscriber drops the
transaction whose commit LSN is X/Y (for a prepared transaction: its COMMIT PREPARED
or its PREPARE LSN), acknowledges it as if applied, and removes the record once the
publisher has been told, as ``ALTER SUBSCRIPTION … SKIP (lsn = X/Y)`` does.

The record is written with an atomic rename, so a reader sees the old record or the
new one, never half of one. A running subscriber notices a new record by its
modification time; it need not be restarted.

FAILURE AND RESTART
    The record is removed only after the flush LSN sent to the publisher has passed
    the skipped transaction's end. A crash before that leaves the record, and the
    transaction, re-sent, is dropped again. A crash of the *publisher* can still
    re-send it after the record is gone (it keeps a slot's position in memory until a
    checkpoint): the apply then stops again on it and ``skip`` is run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sparkapply.errors import StateError
from sparkapply.lsn import Lsn
from sparkapply.state.durable import fsync_dir, write_json_durably
from sparkapply.state.layout import skip_file


@dataclass(frozen=True, slots=True)
class SkipRequest:
    lsn: Lsn  # the finish LSN of the transaction to drop


class SkipStore:
    """Reads and writes ``<work_dir>/skip.json``; safe to use from another process."""

    def __init__(self, work_dir: Path) -> None:
        self.path = skip_file(work_dir)
        self._seen: tuple[int, SkipRequest | None] | None = None  # (mtime_ns, request)

    def request(self, lsn: Lsn) -> None:
        """Record the skip durably (replaces an earlier request)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_durably(self.path, {"lsn": str(lsn)})

    def get(self) -> SkipRequest | None:
        """The pending request; cheap when the file has not changed (one stat)."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._seen = None
            return None
        if self._seen is not None and self._seen[0] == mtime:
            return self._seen[1]
        try:
            raw = json.loads(self.path.read_text())
            request = SkipRequest(Lsn.parse(str(raw["lsn"])))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StateError(
                f"the skip record {self.path} is unreadable: {exc}",
                hint="remove it and run `sparkapply skip --lsn X/Y` again",
            ) from exc
        self._seen = (mtime, request)
        return request

    def clear(self, lsn: Lsn) -> bool:
        """Remove the record if it still asks for ``lsn`` (a newer request stays)."""
        current = self.get()
        if current is None or current.lsn != lsn:
            return False
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)
        self._seen = None
        return True
