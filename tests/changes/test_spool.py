"""The spool's record framing, truncation and chunked reading."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapply.changes import spool
from sparkapply.changes.spool import SpoolDirectory, SpoolWriter, read_records
from sparkapply.errors import StateError
from sparkapply.pgoutput.frames import XLogData


@settings(max_examples=50, deadline=None)
@given(
    records=st.lists(st.tuples(st.binary(max_size=300), st.booleans()), max_size=40),
    chunk=st.integers(min_value=1, max_value=64),
)
def test_records_round_trip_across_chunk_boundaries(
    tmp_path_factory: pytest.TempPathFactory,
    records: list[tuple[bytes, bool]],
    chunk: int,
) -> None:
    path = tmp_path_factory.mktemp("spool") / "s.spool"
    w = SpoolWriter(path)
    w.append(b"before", False)
    start = w.offset
    for payload, in_stream in records:
        w.append(payload, in_stream)
    w.flush()
    old = spool.READ_CHUNK
    spool.READ_CHUNK = chunk  # force records to straddle reads
    try:
        assert list(read_records(w.segment(start))) == records
    finally:
        spool.READ_CHUNK = old


def test_truncate_and_append(tmp_path: Path) -> None:
    w = SpoolWriter(tmp_path / "s.spool")
    w.append(b"a", False)
    mark = w.offset
    w.append(b"b", True)
    w.truncate(mark)
    w.append(b"c", True)
    w.flush()
    assert list(read_records(w.segment(0))) == [(b"a", False), (b"c", True)]


def test_a_cut_record_is_an_error(tmp_path: Path) -> None:
    w = SpoolWriter(tmp_path / "s.spool")
    w.append(b"abcdef", False)
    w.flush()
    seg = w.segment(0)
    bad = type(seg)(seg.path, 0, seg.end - 2)
    with pytest.raises(StateError, match="truncated spool record"):
        list(read_records(bad))


def test_spool_directory_rotates_and_counts_references(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "debris.spool").write_bytes(b"x")  # from an earlier session
    spool = SpoolDirectory(tmp_path / "spool", rotate_bytes=10)
    assert list(spool.root.iterdir()) == []
    first = spool.shared()
    assert spool.shared() is first  # nothing appended: no rotation
    first.append(b"0123456789", False)
    spool.hold(str(first.path))
    spool.hold(str(first.path))
    second = spool.shared()  # past rotate_bytes: a new file; the old one is held
    assert second is not first and first.path.exists()
    spool.release(str(first.path))
    assert first.path.exists()
    spool.release(str(first.path))
    assert not first.path.exists()
    # The current shared file survives its last release; it goes at rotation.
    second.append(b"0123456789", False)
    spool.hold(str(second.path))
    spool.release(str(second.path))
    assert second.path.exists()
    spool.shared()
    assert not second.path.exists()
    stream = spool.new_stream(7)
    assert spool.is_stream(stream) and not spool.is_stream(spool.shared())
    spool.discard(stream)
    assert not stream.path.exists()


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(st.tuples(st.binary(max_size=200), st.booleans()), min_size=1, max_size=40),
    cut=st.integers(min_value=0, max_value=39),
    chunk=st.integers(min_value=1, max_value=500),
)
def test_the_index_and_the_walk_read_the_same_records(
    tmp_path_factory: pytest.TempPathFactory,
    records: list[tuple[bytes, bool]],
    cut: int,
    chunk: int,
) -> None:
    """Records found through the index equal the records found by walking them, also
    after a truncation (a subtransaction abort) and for a segment in the middle."""
    import os

    from sparkapply.changes.spool import index_path, read_chunks

    path = tmp_path_factory.mktemp("spool") / "s.spool"
    w = SpoolWriter(path)
    w.append(b"before", False)
    start = w.offset
    offsets = [w.append(p, f) for p, f in records]
    w.flush()
    keep = min(cut, len(records))
    if keep < len(records):  # drop the tail, then append again
        w.truncate(offsets[keep])
        records = [*records[:keep], (b"again", True)]
        w.append(b"again", True)
    w.append(b"after", False)
    end_of_ours = w.offset - (spool._HEADER.size + len(b"after"))
    w.flush()
    seg = w.segment(start, end_of_ours)
    indexed = [
        (c.data[s : s + n], bool(f))
        for c in read_chunks(seg, chunk)
        for s, n, f in zip(c.starts, c.lengths, c.in_stream, strict=True)
    ]
    assert indexed == records
    os.unlink(index_path(str(path)))  # the walk, without the index
    assert list(read_records(seg)) == records


def test_an_index_that_disagrees_with_the_file_is_not_trusted(tmp_path: Path) -> None:
    from sparkapply.changes.spool import index_path

    w = SpoolWriter(tmp_path / "s.spool")
    for i in range(10):
        w.append(b"x" * i, False)
    w.flush()
    w.close()
    with open(index_path(str(tmp_path / "s.spool")), "r+b") as f:
        f.seek(8 * 3)
        f.write((999).to_bytes(8, "little"))  # a wrong start
    got = list(read_records(spool.SpoolSegment(str(tmp_path / "s.spool"), 0, w.offset)))
    assert got == [(b"x" * i, False) for i in range(10)]


def test_a_batch_releases_a_file_by_how_many_of_its_transactions_used_it(tmp_path: Path) -> None:
    spool = SpoolDirectory(tmp_path, rotate_bytes=10)
    first = spool.shared()
    first.append(b"0123456789", False)
    spool.hold(str(first.path), 3)
    spool.shared()  # rotated: the old file lives as long as a transaction holds it
    spool.release(str(first.path), 2)
    assert first.path.exists()
    spool.release(str(first.path), 1)
    assert not first.path.exists()


def _frames_joined(messages: list[bytes]) -> tuple[bytearray, np.ndarray]:
    """XLogData frames of ``messages``, joined as the receiving thread joins a run."""
    frames = [XLogData(7 + i, 9 + i, 0, msg).encode() for i, msg in enumerate(messages)]
    return bytearray().join(frames), np.array([len(f) for f in frames], np.int64)


@settings(max_examples=50, deadline=None)
@given(
    runs=st.lists(
        st.tuples(st.lists(st.binary(max_size=120), max_size=12), st.booleans()), max_size=6
    ),
    plain=st.lists(st.binary(max_size=40), max_size=3),
    cut=st.integers(min_value=0, max_value=40),
    chunk=st.integers(min_value=1, max_value=96),
)
def test_framed_runs_read_as_their_messages(
    tmp_path_factory: pytest.TempPathFactory,
    runs: list[tuple[list[bytes], bool]],
    plain: list[bytes],
    cut: int,
    chunk: int,
) -> None:
    """Runs of whole frames spooled in place (FLAG_FRAMED) read back as their
    messages, between plain records, through the index and by the walk, also after a
    truncation at a framed record's offset (a subtransaction abort)."""
    from sparkapply.changes.spool import index_path, read_chunks

    path = tmp_path_factory.mktemp("spool") / "s.spool"
    w = SpoolWriter(path)
    start = w.offset
    want: list[tuple[bytes, bool]] = []
    starts: list[int] = []
    for messages, in_stream in runs:
        joined, sizes = _frames_joined(messages)
        offsets = w.extend_frames(joined, sizes, in_stream)
        assert len(offsets) == len(messages) + 1 and offsets[-1] == w.offset
        starts += offsets[:-1]
        want += [(msg, in_stream) for msg in messages]
        for payload in plain:
            starts.append(w.append(payload, False))
            want.append((payload, False))
    if cut < len(starts):
        w.truncate(starts[cut])
        want = want[:cut]
        joined, sizes = _frames_joined([b"again"])
        w.extend_frames(joined, sizes, True)
        want.append((b"again", True))
    w.flush()
    seg = w.segment(start)
    indexed = [
        (bytes(c.data[s : s + n]), bool(f))
        for c in read_chunks(seg, chunk)
        for s, n, f in zip(c.starts, c.lengths, c.in_stream, strict=True)
    ]
    assert indexed == want
    os.unlink(index_path(str(path)))  # the walk, without the index
    old = spool.READ_CHUNK
    spool.READ_CHUNK = chunk
    try:
        assert [(bytes(p), f) for p, f in read_records(seg)] == want
    finally:
        spool.READ_CHUNK = old


def test_a_framed_record_shorter_than_its_pad_is_an_error(tmp_path: Path) -> None:
    """A record flagged framed whose length cannot hold the rest of an XLogData head
    (a damaged file) is an error on both ways of reading, not a negative slice."""
    from sparkapply.changes.spool import FLAG_FRAMED, FRAME_PAD, index_path

    path = tmp_path / "s.spool"
    w = SpoolWriter(path)
    w.append(b"x" * (FRAME_PAD - 1), False)
    w.flush()
    w.close()
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(bytes([FLAG_FRAMED]))
    seg = spool.SpoolSegment(str(path), 0, w.offset)
    with pytest.raises(StateError, match="framed record too short"):
        list(read_records(seg))
    os.unlink(index_path(str(path)))
    with pytest.raises(StateError, match="framed record too short"):
        list(read_records(seg))
