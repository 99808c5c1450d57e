"""What sparkapply keeps under ``work_dir``, read from outside the subscriber too.

``spool/`` (in-progress and not yet applied transactions, rebuilt on every start),
``prepared/`` (staged prepared transactions, durable), ``skip.json`` (a pending
``sparkapply skip``), ``cut-requests/`` (``cut --at-lsn``: changes/cut_requests.py)
and ``verify.json`` (the last ``sparkapply verify``'s verdict, for the metrics).
``status`` and the metrics read these while ``run`` writes them, so every reader
tolerates files that vanish under it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from sparkapply.changes.prepared import PreparedEntry, PreparedStore
from sparkapply.errors import StateError


def spool_dir(work_dir: Path) -> Path:
    return work_dir / "spool"


def prepared_dir(work_dir: Path) -> Path:
    return work_dir / "prepared"


def spool_bytes(work_dir: Path) -> int:
    """Bytes in the spool's files (0 when there is no spool)."""
    total = 0
    try:
        entries = list(os.scandir(spool_dir(work_dir)))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:  # released while we looked
            continue
    return total


def pending_prepared(work_dir: Path) -> list[PreparedEntry]:
    """Staged prepared transactions, by xid; those removed while reading are left out."""
    root = prepared_dir(work_dir)
    if not root.is_dir():
        return []
    store = PreparedStore(root)
    out = []
    for xid in store.xids():
        try:
            entry = store.get(xid)
        except StateError:  # committed or rolled back while we read it
            continue
        if entry is not None:
            out.append(entry)
    return out


VERIFY_FILE = "verify.json"


def record_verify(work_dir: Path, *, lsn: str, match: bool, differing: list[str]) -> None:
    """The last verify's verdict (written whole, by rename)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = work_dir / f".{VERIFY_FILE}.tmp"
    verdict = {"at": time.time(), "lsn": lsn, "match": match, "differing": differing}
    tmp.write_text(json.dumps(verdict))
    os.replace(tmp, work_dir / VERIFY_FILE)


def last_verify(work_dir: Path) -> dict[str, Any] | None:
    """The last verify's verdict, or None (never run, or unreadable)."""
    try:
        data = json.loads((work_dir / VERIFY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
