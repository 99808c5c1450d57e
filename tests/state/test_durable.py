"""Durable writes: whole files by rename, and which directory gets fsynced."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkapply.state import durable


def test_write_replaces_the_file_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    durable.write_json_durably(path, {"a": 1})
    durable.write_json_durably(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_the_directory_is_fsynced_unless_asked_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(durable, "fsync_dir", synced.append)
    durable.write_json_durably(tmp_path / "a.json", [])
    durable.write_json_durably(tmp_path / "b.json", [], sync_dir=False)
    assert synced == [tmp_path]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    durable.write_json_durably(path, {"a": 1})
    with pytest.raises(TypeError):
        durable.write_json_durably(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}


def test_fsync_dir(tmp_path: Path) -> None:
    durable.fsync_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        durable.fsync_dir(tmp_path / "missing")
    assert os.path.isdir(tmp_path)
