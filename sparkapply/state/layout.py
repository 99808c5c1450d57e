"""Where everything under ``work_dir`` lives: the one module that spells its paths.

::

    spool/               transactions in progress or not yet applied, rebuilt on
                         every start (changes/spool.py)
    prepared/            the prepared store (changes/prepared.py, state/prepared_files.py)
      <xid>.spool          a prepared transaction's change records
      <xid>.json           its metadata, written last: the entry exists once it does
      <xid>.staged.json    the files staged for it while it arrived (staging/stager.py)
    staging/             the journal of staged pieces, <prefix><xid>.json (staging/stager.py)
    skip.json            a pending ``sparkapply skip`` (changes/skip.py)
    cut-requests/<X>     ``sparkapply cut --at-lsn X``, X as 16 hex digits
                         (changes/cut_requests.py)
    cut-requests/hold-<F>-<until>-<pid>
                         ``verify`` about to ask for a cut above F: apply nothing
                         above F until the file goes or ``until`` passes
    verify.json          the last ``sparkapply verify``'s verdict (state/verdict.py)
    run.lock             locked (flock) while a ``run`` lives (state/presence.py)
    logs/                Spark's output (apply/session.py)
      batches.jsonl        one JSON line per acknowledged batch (state/batch_log.py)
    run.json             what the work_dir's ``run`` is doing: streaming, retrying (what
                         failed, since when), stopped (state/run_state.py)
    DEMO                 this work_dir was made by ``sparkapply demo``, which may remove
                         and remake it (commands/demo.py); no other work_dir is touched

``status`` and the metrics read these while ``run`` writes them, so every reader
tolerates files that vanish under it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

SPOOL_DIR = "spool"
PREPARED_DIR = "prepared"
"""The prepared store's directory (it must survive restarts)."""
STAGING_DIR = "staging"
SKIP_FILE = "skip.json"
CUT_REQUESTS_DIR = "cut-requests"
VERIFY_FILE = "verify.json"
LOGS_DIR = "logs"
DEMO_MARKER = "DEMO"
RUN_FILE = "run.json"
RUN_LOCK = "run.lock"


def _entry(name: str) -> Callable[[Path], Path]:
    """The path of one entry directly under a ``work_dir``."""

    def path(work_dir: Path) -> Path:
        return work_dir / name

    return path


spool_dir = _entry(SPOOL_DIR)
prepared_dir = _entry(PREPARED_DIR)
staging_dir = _entry(STAGING_DIR)
skip_file = _entry(SKIP_FILE)
cut_requests_dir = _entry(CUT_REQUESTS_DIR)
verify_file = _entry(VERIFY_FILE)
logs_dir = _entry(LOGS_DIR)
run_lock = _entry(RUN_LOCK)


def batch_log_file(work_dir: Path) -> Path:
    return logs_dir(work_dir) / "batches.jsonl"


demo_marker = _entry(DEMO_MARKER)
run_file = _entry(RUN_FILE)


# -- inside prepared/ (given the store's directory: tests keep stores elsewhere) -----------

_PREPARED_META = re.compile(r"^(\d+)\.json$")


def prepared_spool(root: Path, xid: int) -> Path:
    return root / f"{xid}.spool"


def prepared_meta(root: Path, xid: int) -> Path:
    return root / f"{xid}.json"


def staged_record(root: Path, xid: int) -> Path:
    return root / f"{xid}.staged.json"


def prepared_xids(root: Path) -> list[int]:
    """The xids with a metadata file under ``root`` (not the staging records beside
    them, nor a ``.tmp`` half written), lowest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := _PREPARED_META.match(name)))


def staged_records(root: Path) -> list[Path]:
    return sorted(root.glob("*.staged.json"))


# -- inside staging/ ------------------------------------------------------------------------


def journal_entry(root: Path, prefix: str, xid: int) -> Path:
    return root / f"{prefix}{xid}.json"


def is_journal_entry(path: Path) -> bool:
    """False for what else the journal's directory holds: an entry half written."""
    return path.suffix == ".json"


# -- inside cut-requests/ -------------------------------------------------------------------


def cut_request_name(lsn: int) -> str:
    """The request's file name: 16 hex digits, so that names sort as LSNs."""
    return f"{int(lsn):016X}"


def cut_request_lsn(name: str) -> int:
    """The LSN a request's file name asks for; ValueError for a file that is not one."""
    return int(name, 16)


HOLD_PREFIX = "hold-"


def cut_hold_name(floor: int, until: float, pid: int) -> str:
    """A hold's file name: ``hold-<floor, 16 hex>-<until, unix ms>-<pid>``."""
    return f"{HOLD_PREFIX}{int(floor):016X}-{int(until * 1000)}-{pid}"


def cut_hold_of(name: str) -> tuple[int, float] | None:
    """``(floor, until)`` of a hold's file name; None for a file that is not one."""
    if not name.startswith(HOLD_PREFIX):
        return None
    parts = name[len(HOLD_PREFIX) :].split("-")
    try:
        return int(parts[0], 16), int(parts[1]) / 1000
    except (IndexError, ValueError):
        return None


# -- sizes --------------------------------------------------------------------------------


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
