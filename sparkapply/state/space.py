"""A full disk under ``work_dir``, said as an operator needs it: which path, how much.

Writers call :func:`full_disk_error` from their ``except OSError`` and raise what it
returns. Nothing acknowledged depends on a spool write that failed: the spool is made
again from the slot's confirmed position at every start, so ``run`` stops (exit 2),
and once space is freed the next ``run`` goes on exactly.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from sparkapply.errors import DiskFullError

FULL = (errno.ENOSPC, errno.EDQUOT)


def full_disk_error(exc: OSError, path: Path | str, needed: int) -> DiskFullError | None:
    """The error to raise for ``exc`` (a write of ``needed`` bytes to ``path``), or
    None when it is not a full disk or quota."""
    if exc.errno not in FULL:
        return None
    path = Path(path)
    try:
        usage = shutil.disk_usage(path.parent)
        room = f"{usage.free:,} of {usage.total:,} bytes free"
    except OSError:
        room = "free space unknown"
    return DiskFullError(
        f"no space left for {path}: a write of {needed:,} bytes failed ({room})",
        hint=f"free space on the file system of {path.parent} (or give work_dir a larger "
        "one), then run again: what was acknowledged is durable, and the rest is received "
        "again from the slot",
        path=str(path),
    )
