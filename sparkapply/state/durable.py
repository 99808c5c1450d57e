"""Durable writes: a file replaced whole by an atomic rename, and a directory fsync.

A reader in another process (``status``, the metrics) sees the old file or the new
one, never half of one. After :func:`write_json_durably` (and :func:`fsync_dir` after
an unlink) returns, the change survives a crash of the machine; until then a crash
leaves the old file and possibly a ``<name>.tmp`` beside it, which the next write
replaces.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sparkapply.state.space import full_disk_error


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (renames, unlinks, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_durably(path: Path, doc: object, *, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``doc`` as JSON: written to ``<name>.tmp`` beside it,
    fsynced, renamed over it, then (``sync_dir``) its directory fsynced so the rename
    itself survives a crash. Errors are the ``OSError`` (or ``TypeError`` for a ``doc``
    that is not JSON) of the step that failed."""
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(doc)
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise full_disk_error(exc, path, len(text)) or exc from exc
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)
