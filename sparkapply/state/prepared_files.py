"""The prepared store's files: ``<xid>.spool`` and ``<xid>.json`` in its directory.

An entry exists once its metadata file does. The spool is made complete and fsynced
first; the metadata is written last, by an atomic rename, and the directory fsynced:
so a crash leaves either the whole entry or a spool without metadata, which is debris
and is ignored (a PREPARE sent again replaces it). What the metadata says is
``changes/prepared.py``'s (``PreparedEntry``); this module only moves the bytes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from sparkapply.errors import StateError
from sparkapply.state.durable import fsync_dir, write_json_durably
from sparkapply.state.layout import prepared_meta, prepared_spool

_COPY_CHUNK = 1 << 20


def take_spool(
    root: Path, xid: int, source: str, start: int, end: int, *, move: bool, keep_source: bool
) -> Path:
    """Put bytes ``start:end`` of the spool file ``source`` in place as the spool of
    ``xid``, fsynced, and drop the old entry's metadata first (a re-sent PREPARE
    replaces the entry). ``move`` (only when ``start`` is 0) renames the whole file
    in, ``keep_source`` links it instead (others still read it by its name); otherwise,
    or with no hard links here, the range is copied."""
    spool, meta = prepared_spool(root, xid), prepared_meta(root, xid)
    meta.unlink(missing_ok=True)
    if move and start == 0 and keep_source:
        try:
            spool.unlink(missing_ok=True)
            os.link(source, spool)
        except OSError:  # no hard links here: copy below
            move = False
    elif move and start == 0:
        os.replace(source, spool)
    if move and start == 0:
        with open(spool, "r+b") as f:
            f.truncate(end)
            os.fsync(f.fileno())
    else:
        _copy_range(source, start, end, spool, xid)
    return spool


def _copy_range(source: str, start: int, end: int, dest: Path, xid: int) -> None:
    with open(source, "rb") as src, open(dest, "wb") as dst:
        src.seek(start)
        remaining = end - start
        while remaining > 0:
            chunk = src.read(min(remaining, _COPY_CHUNK))
            if not chunk:
                raise StateError(f"spool {source} ended early while staging xid {xid}")
            dst.write(chunk)
            remaining -= len(chunk)
        dst.flush()
        os.fsync(dst.fileno())


def write_meta(root: Path, xid: int, doc: dict[str, Any]) -> None:
    """Write the metadata of ``xid`` last: from here on the entry exists, durably."""
    write_json_durably(prepared_meta(root, xid), doc)


def read_meta(root: Path, xid: int) -> dict[str, Any] | None:
    """The metadata of ``xid``, or None when it has no entry."""
    meta = prepared_meta(root, xid)
    try:
        raw = json.loads(meta.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateError(f"prepared transaction metadata {meta} is unreadable: {exc}") from exc
    if not isinstance(raw, dict):
        raise StateError(f"prepared transaction metadata {meta} is unreadable: not an object")
    return raw


def spool_size(root: Path, xid: int) -> int | None:
    """The size of the spool file of ``xid``; None when it is missing."""
    try:
        return prepared_spool(root, xid).stat().st_size
    except FileNotFoundError:
        return None


def remove(root: Path, xid: int) -> None:
    """Remove the entry of ``xid`` (metadata first, so no half entry is seen), durably."""
    prepared_meta(root, xid).unlink(missing_ok=True)
    prepared_spool(root, xid).unlink(missing_ok=True)
    fsync_dir(root)


def clear(root: Path) -> None:
    """Remove every entry and any debris, leaving ``root`` empty."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
