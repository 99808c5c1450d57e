"""The prepared store: an entry's own serialisation, staging and reading back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkapply.changes.prepared import PreparedEntry, PreparedStore
from sparkapply.changes.spool import SpoolSegment
from sparkapply.errors import StateError
from sparkapply.lsn import Lsn
from sparkapply.state.layout import PREPARED_DIR


def _entry(**kw: object) -> PreparedEntry:
    base: dict[str, object] = {
        "xid": 7,
        "gid": "",
        "prepare_lsn": Lsn(0x1_0000_0010),
        "end_lsn": Lsn(0x1_0000_0020),
        "prepare_time": 123,
        "n_changes": 3,
        "has_truncate": True,
        "relation_ids": frozenset({5, 2}),
        "mutated_relation_ids": frozenset({2}),
        "spool_path": "/x/7.spool",
        "spool_size": 42,
        "start_relations": (b"R\x00\x01",),
        "own_relations": (b"",),
        "streamed": True,
    }
    base.update(kw)
    return PreparedEntry(**base)  # type: ignore[arg-type]  # the fields, by name


def test_entry_json_round_trip() -> None:
    entry = _entry()
    raw = json.loads(json.dumps(entry.to_json()))
    assert raw["prepare_lsn"] == "1/10" and raw["relation_ids"] == [2, 5]
    assert "spool_path" not in raw  # where the file is, not what it says
    assert PreparedEntry.from_json(raw, spool_path="/x/7.spool") == entry
    none = _entry(mutated_relation_ids=None)
    assert PreparedEntry.from_json(none.to_json(), spool_path="/x/7.spool") == none


def test_entry_written_before_mutated_ids_existed_reads_as_none() -> None:
    raw = _entry().to_json()
    del raw["mutated_relation_ids"]
    assert PreparedEntry.from_json(raw, spool_path="p").mutated_relation_ids is None


def test_stage_get_remove(tmp_path: Path) -> None:
    store = PreparedStore.in_work_dir(tmp_path)
    assert store.root == tmp_path / PREPARED_DIR and store.root.is_dir()
    source = tmp_path / "stream.spool"
    source.write_bytes(b"abcdefgh")
    staged = store.stage(
        xid=9,
        gid="g",
        prepare_lsn=16,
        end_lsn=32,
        prepare_time=1,
        n_changes=2,
        has_truncate=False,
        relation_ids=frozenset({1}),
        mutated_relation_ids=frozenset({1}),
        start_relations=(b"r",),
        own_relations=(),
        streamed=False,
        source=SpoolSegment(str(source), 2, 6),
        move=False,
    )
    assert PreparedStore.in_work_dir(tmp_path).get(9) == staged
    assert Path(staged.spool_path).read_bytes() == b"cdef"
    assert store.xids() == [9]
    Path(staged.spool_path).write_bytes(b"c")  # a damaged work dir
    with pytest.raises(StateError, match="lost its spool"):
        store.get(9)
    store.remove(9)
    assert store.get(9) is None and store.xids() == []
