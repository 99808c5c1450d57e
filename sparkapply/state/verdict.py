"""The last ``sparkapply verify``'s verdict, kept for the metrics (``verify.json``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sparkapply.state.durable import write_json_durably
from sparkapply.state.layout import verify_file


def record_verify(work_dir: Path, *, lsn: str, match: bool, differing: list[str]) -> None:
    """The last verify's verdict (written whole and durably, by rename)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    verdict = {"at": time.time(), "lsn": lsn, "match": match, "differing": differing}
    write_json_durably(verify_file(work_dir), verdict)


def last_verify(work_dir: Path) -> dict[str, Any] | None:
    """The last verify's verdict, or None (never run, or unreadable)."""
    try:
        data = json.loads(verify_file(work_dir).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
