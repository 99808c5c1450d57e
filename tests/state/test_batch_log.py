"""The batch record: one whole JSON line per batch, rotated, read back in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkapply.lsn import Lsn
from sparkapply.state import batch_log
from sparkapply.state.batch_log import FIELDS, BatchLog, read_batch_log
from sparkapply.state.layout import batch_log_file


def _figures(n: int) -> dict[str, object]:
    return {
        "transactions": n,
        "changes": 2 * n,
        "staged_rows": 0,
        "tables": 1,
        "seconds": 0.5,
        "plan_seconds": 0.1,
        "job_seconds": 0.3,
        "commit_seconds": 0.1,
        "path": "driver_fold",
    }


def test_lines_are_whole_and_carry_every_field(tmp_path: Path) -> None:
    log = BatchLog(tmp_path)
    for n in range(1, 4):
        log.append(Lsn(1000 * n), **_figures(n))
    records = read_batch_log(tmp_path)
    assert [r["transactions"] for r in records] == [1, 2, 3]
    assert all(tuple(r) == FIELDS for r in records)
    assert records[2]["flushed"] == str(Lsn(3000)) and records[2]["flushed_lsn"] == 3000
    assert read_batch_log(tmp_path, since=records[1]["at"]) == records[1:]
    # A line cut short by a read racing its write is left out, not misread.
    with open(batch_log_file(tmp_path), "a") as f:
        f.write('{"at": 1')
    assert len(read_batch_log(tmp_path)) == 3


def test_the_file_rotates_and_both_parts_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_log, "ROTATE_BYTES", 600)
    log = BatchLog(tmp_path)
    for n in range(1, 11):
        log.append(Lsn(n), **_figures(n))
    path = batch_log_file(tmp_path)
    assert path.with_name("batches.jsonl.1").exists() and path.stat().st_size <= 600
    kept = [r["transactions"] for r in read_batch_log(tmp_path)]
    assert kept == sorted(kept) and kept[-1] == 10 and len(kept) >= 4
