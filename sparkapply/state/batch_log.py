"""The record of every batch ``run`` acknowledges: one JSON line each, in
``work_dir/logs/batches.jsonl`` (state/layout.py), for tools that read a run from the
outside (the benchmarks, a dashboard) instead of parsing its log text.

A line is written by the receiving thread as it acknowledges the batch, and is
complete when it appears (one ``write`` of the whole line, in append mode). The file is
rotated at :data:`ROTATE_BYTES`: the previous one is kept as ``batches.jsonl.1``.
The fields, all present in every line:

``at``             epoch seconds when the batch was acknowledged
``transactions``   source transactions applied; ``changes`` their row changes
``staged_rows``    rows committed from files staged while their transaction arrived
``tables``         tables committed
``seconds``        the batch on the apply thread, from its start to its commit
``plan_seconds``, ``job_seconds``, ``commit_seconds``: where those seconds went
``path``           ``job`` (a Spark job folded it) or ``driver_fold``
``flushed``        the position acknowledged after it (``X/Y``); ``flushed_lsn`` as bytes
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from sparkapply.lsn import Lsn
from sparkapply.state.layout import batch_log_file

ROTATE_BYTES = 64 * 1024 * 1024
FIELDS = (
    "at",
    "transactions",
    "changes",
    "staged_rows",
    "tables",
    "seconds",
    "plan_seconds",
    "job_seconds",
    "commit_seconds",
    "path",
    "flushed",
    "flushed_lsn",
)


class BatchLog:
    def __init__(self, work_dir: Path) -> None:
        self.path = batch_log_file(work_dir)
        self._size = -1  # not yet looked at

    def append(self, flushed: Lsn, **figures: Any) -> None:
        """One batch's line; ``figures`` are the fields but ``at`` and ``flushed``."""
        record = {"at": round(time.time(), 6), **figures}
        record.update(flushed=str(flushed), flushed_lsn=int(flushed))
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        if self._size < 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._size = self.path.stat().st_size if self.path.exists() else 0
        if self._size + len(line) > ROTATE_BYTES:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._size = 0
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        self._size += len(line)


def read_batch_log(work_dir: Path, since: float = 0.0) -> list[dict[str, Any]]:
    """The batches acknowledged at or after ``since`` (epoch seconds), oldest first,
    from the rotated file too. A line cut short (a read racing its write) is left out."""
    path = batch_log_file(work_dir)
    out: list[dict[str, Any]] = []
    for part in (path.with_name(path.name + ".1"), path):
        try:
            text = part.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record["at"] >= since:
                out.append(record)
    return out
