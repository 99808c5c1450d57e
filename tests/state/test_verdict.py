"""The last verify's verdict, as the metrics read it."""

from __future__ import annotations

from pathlib import Path

from sparkapply.state.layout import verify_file
from sparkapply.state.verdict import last_verify, record_verify


def test_record_and_read_back(tmp_path: Path) -> None:
    work = tmp_path / "work"
    assert last_verify(work) is None  # never run
    record_verify(work, lsn="0/10", match=False, differing=["public.t"])
    verdict = last_verify(work)
    assert verdict is not None
    assert (verdict["lsn"], verdict["match"], verdict["differing"]) == ("0/10", False, ["public.t"])
    assert [p.name for p in work.iterdir()] == ["verify.json"]
    verify_file(work).write_text("[1]")  # not a verdict
    assert last_verify(work) is None
