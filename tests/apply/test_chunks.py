"""A batch's tables read a shared spool segment once (apply/fold/chunks.py): inside
``shared`` the second reader gets the first's indexed chunks; outside it, and in
another thread, every read is fresh."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sparkapply.apply.fold import chunks
from sparkapply.changes.spool import SpoolSegment, SpoolWriter, read_chunks
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m


def segment(directory: Path) -> SpoolSegment:
    writer = SpoolWriter(directory / "s.spool")
    start = writer.offset
    for relid in (1, 2, 1, 3):
        writer.append(encode(m.Insert(None, relid, m.TupleData(b"t", (b"7",)))), False)
    end = writer.offset
    writer.close()
    return SpoolSegment(str(writer.path), start, end)


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> list[SpoolSegment]:
    seen: list[SpoolSegment] = []

    def counted(seg: SpoolSegment, chunk_size: int | None = None) -> object:
        seen.append(seg)
        return read_chunks(seg, chunk_size)

    monkeypatch.setattr(chunks, "read_chunks", counted)
    return seen


def test_inside_shared_a_segment_is_read_once(tmp_path: Path, reads: list[SpoolSegment]) -> None:
    seg = segment(tmp_path)
    with chunks.shared():
        first = list(chunks.indexed_chunks(seg))
        with chunks.shared():  # nested: the outer memo stays
            second = list(chunks.indexed_chunks(seg))
        third = list(chunks.indexed_chunks(seg))
    assert len(reads) == 1
    assert [id(ix) for ix in first] == [id(ix) for ix in second] == [id(ix) for ix in third]
    assert first[0].relids.tolist() == [1, 2, 1, 3]


def test_outside_shared_and_in_another_thread_reads_are_fresh(
    tmp_path: Path, reads: list[SpoolSegment]
) -> None:
    seg = segment(tmp_path)
    a = list(chunks.indexed_chunks(seg))
    b = list(chunks.indexed_chunks(seg))
    assert len(reads) == 2 and a[0] is not b[0]
    other: list[int] = []
    with chunks.shared():
        list(chunks.indexed_chunks(seg))
        thread = threading.Thread(
            target=lambda: other.extend(id(ix) for ix in chunks.indexed_chunks(seg))
        )
        thread.start()
        thread.join()
        list(chunks.indexed_chunks(seg))
    assert len(reads) == 4  # 2 above, 1 in the scope, 1 in the other thread
    list(chunks.indexed_chunks(seg))
    assert len(reads) == 5  # the scope ended with its memo


def test_past_the_budget_segments_are_read_as_outside(
    tmp_path: Path, reads: list[SpoolSegment], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big transaction's task must not hold its whole spool: past ``HELD_BYTES`` a
    segment streams, read afresh each time."""
    seg = segment(tmp_path)
    (tmp_path / "other").mkdir()
    other = segment(tmp_path / "other")
    monkeypatch.setattr(chunks, "HELD_BYTES", seg.nbytes + 1)
    with chunks.shared():
        list(chunks.indexed_chunks(seg))  # held: within the budget
        list(chunks.indexed_chunks(seg))
        assert len(reads) == 1
        a = list(chunks.indexed_chunks(other))  # would pass the budget: not held
        b = list(chunks.indexed_chunks(other))
        assert len(reads) == 3 and a[0] is not b[0]
        assert a[0].relids.tolist() == b[0].relids.tolist() == [1, 2, 1, 3]
