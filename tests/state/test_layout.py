"""The work_dir layout: names, the prepared store's listing, cut request names."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkapply.state import layout


def test_every_path_is_under_work_dir(tmp_path: Path) -> None:
    paths = {
        layout.spool_dir(tmp_path): "spool",
        layout.prepared_dir(tmp_path): "prepared",
        layout.staging_dir(tmp_path): "staging",
        layout.skip_file(tmp_path): "skip.json",
        layout.cut_requests_dir(tmp_path): "cut-requests",
        layout.verify_file(tmp_path): "verify.json",
        layout.logs_dir(tmp_path): "logs",
        layout.run_lock(tmp_path): "run.lock",
    }
    for path, name in paths.items():
        assert path == tmp_path / name


def test_prepared_xids_are_the_metadata_files_only(tmp_path: Path) -> None:
    root = tmp_path / "prepared"
    assert layout.prepared_xids(root) == []  # no store yet
    root.mkdir()
    for xid in (12, 3):
        layout.prepared_meta(root, xid).write_text("{}")
        layout.prepared_spool(root, xid).write_bytes(b"")
    layout.prepared_spool(root, 40).write_bytes(b"")  # debris: a spool without metadata
    layout.staged_record(root, 12).write_text("{}")  # beside an entry, not one itself
    (root / "5.json.tmp").write_text("{")  # half written
    assert layout.prepared_xids(root) == [3, 12]
    assert layout.staged_records(root) == [root / "12.staged.json"]


def test_journal_entries_and_half_written_ones(tmp_path: Path) -> None:
    entry = layout.journal_entry(tmp_path, "sparkapply-staged-ab-", 7)
    assert entry.name == "sparkapply-staged-ab-7.json" and layout.is_journal_entry(entry)
    assert not layout.is_journal_entry(entry.with_name(entry.name + ".tmp"))


def test_cut_request_names_sort_as_lsns() -> None:
    lsns = [0x1_0000_0000, 0x10, 0xFFFF_FFFF]
    names = sorted(layout.cut_request_name(lsn) for lsn in lsns)
    assert [layout.cut_request_lsn(n) for n in names] == sorted(lsns)
    assert layout.cut_request_name(0x10) == "0000000000000010"
    with pytest.raises(ValueError):
        layout.cut_request_lsn("README")


def test_a_hold_name_carries_its_floor_and_time_and_is_no_request() -> None:
    name = layout.cut_hold_name(0x1_0000_0010, 1234.5, 77)
    assert layout.cut_hold_of(name) == (0x1_0000_0010, 1234.5)
    with pytest.raises(ValueError):
        layout.cut_request_lsn(name)
    assert layout.cut_hold_of("0000000000000010") is None
    assert layout.cut_hold_of("hold-zz") is None


def test_spool_bytes(tmp_path: Path) -> None:
    assert layout.spool_bytes(tmp_path) == 0  # no spool
    layout.spool_dir(tmp_path).mkdir()
    (layout.spool_dir(tmp_path) / "txns-0.spool").write_bytes(b"x" * 10)
    (layout.spool_dir(tmp_path) / "sub").mkdir()  # not a file: not counted
    assert layout.spool_bytes(tmp_path) == 10
