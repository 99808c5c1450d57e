"""The prepared store's files: taking a spool in, the metadata, removal."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkapply.errors import StateError
from sparkapply.state import prepared_files
from sparkapply.state.layout import prepared_meta, prepared_spool, prepared_xids


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "prepared"
    path.mkdir()
    return path


def _source(tmp_path: Path) -> str:
    path = tmp_path / "stream-9.spool"
    path.write_bytes(b"abcdefgh")
    return str(path)


@pytest.mark.parametrize(("move", "keep_source"), [(False, False), (True, False), (True, True)])
def test_take_spool(root: Path, tmp_path: Path, move: bool, keep_source: bool) -> None:
    source = _source(tmp_path)
    spool = prepared_files.take_spool(root, 9, source, 0, 6, move=move, keep_source=keep_source)
    assert spool == prepared_spool(root, 9) and spool.read_bytes() == b"abcdef"
    assert Path(source).exists() == (not move or keep_source)


def test_a_copy_of_a_range_and_a_source_that_ends_early(root: Path, tmp_path: Path) -> None:
    source = _source(tmp_path)
    spool = prepared_files.take_spool(root, 9, source, 2, 6, move=True, keep_source=False)
    assert spool.read_bytes() == b"cdef" and Path(source).exists()  # not from 0: copied
    with pytest.raises(StateError, match="ended early while staging xid 9"):
        prepared_files.take_spool(root, 9, source, 2, 60, move=False, keep_source=False)


def test_a_prepare_sent_again_drops_the_old_metadata_first(root: Path, tmp_path: Path) -> None:
    prepared_files.write_meta(root, 9, {"xid": 9})
    assert prepared_xids(root) == [9]
    prepared_files.take_spool(root, 9, _source(tmp_path), 0, 1, move=False, keep_source=False)
    assert prepared_xids(root) == []  # until its new metadata is written


def test_meta_round_trip_unreadable_and_remove(root: Path) -> None:
    assert prepared_files.read_meta(root, 9) is None
    assert prepared_files.spool_size(root, 9) is None
    prepared_files.write_meta(root, 9, {"xid": 9, "gid": "g"})
    prepared_spool(root, 9).write_bytes(b"xy")
    assert prepared_files.read_meta(root, 9) == {"xid": 9, "gid": "g"}
    assert prepared_files.spool_size(root, 9) == 2
    prepared_meta(root, 9).write_text("{")
    with pytest.raises(StateError, match="is unreadable"):
        prepared_files.read_meta(root, 9)
    prepared_files.remove(root, 9)
    assert list(root.iterdir()) == []


def test_clear(root: Path) -> None:
    prepared_files.write_meta(root, 1, {})
    (root / "debris.spool").write_bytes(b"")
    prepared_files.clear(root)
    assert root.is_dir() and list(root.iterdir()) == []
