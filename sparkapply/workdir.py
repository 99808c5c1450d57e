"""What sparkapply keeps under ``work_dir``, read from outside the subscriber too.

``spool/`` (in-progress and not yet applied transactions, rebuilt on every start),
``prepared/`` (staged prepared transactions, durable) and ``skip.json`` (a pending
``sparkapply skip``). ``status`` and the metrics read these while ``run`` writes them,
so every reader tolerates files that vanish under it.
"""

from __future__ import annotations

import os
from pathlib import Path

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
