"""Locating the live rows a batch replaces: a file searched through its sorted key
finds exactly the rows a scan of it finds, deleted rows left out, whatever the
order, repetition or type of the keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.apply.write import file_cache, locate
from sparkapply.apply.write.file_cache import ColumnCache
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo


def data_file(path: Path, keys: np.ndarray, type_: pa.DataType) -> DataFileInfo:
    pq.write_table(pa.table({"id": pa.array(keys).cast(type_), "v": keys % 7}), path)
    return DataFileInfo(f"file://{path}", len(keys), path.stat().st_size)


def delete_file(path: Path, named: dict[str, np.ndarray]) -> DeleteFileInfo:
    names = sorted(named)
    table = pa.table(
        {
            "file_path": [p for p in names for _ in named[p]],
            "pos": pa.array(np.concatenate([np.sort(named[p]) for p in names]), pa.int64()),
        }
    )
    pq.write_table(table, path)
    pos = table.column("pos").to_numpy()
    return DeleteFileInfo(
        f"file://{path}", table.num_rows, path.stat().st_size, names[0], names[-1],
        int(pos.min()), int(pos.max()),
    )  # fmt: skip


def expected(
    files: list[tuple[DataFileInfo, np.ndarray]], gone: dict[str, set[int]], wanted: set[int]
) -> dict[str, list[int]]:
    out = {}
    for f, keys in files:
        rows = [i for i, k in enumerate(keys.tolist()) if k in wanted and i not in gone[f.path]]
        if rows:
            out[f.path] = rows
    return out


@pytest.mark.parametrize("type_", [pa.int64(), pa.int32(), pa.int16()])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_sorted_key_finds_what_a_scan_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, type_: pa.DataType, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    files: list[tuple[DataFileInfo, np.ndarray]] = []
    for i, n in enumerate([5000, 3000, 40]):
        keys = rng.choice(20000, n, replace=False).astype(np.int64)
        if i == 1:  # one file holds some keys twice (an older, deleted version)
            keys[-50:] = keys[:50]
        files.append((data_file(tmp_path / f"d{i}.parquet", keys, type_), keys))
    gone: dict[str, set[int]] = {f.path: set() for f, _ in files}
    deletes = []
    for j in range(3):
        named = {}
        for f, keys in files[:2]:
            pos = rng.choice(len(keys), len(keys) // 10, replace=False)
            gone[f.path].update(pos.tolist())
            named[f.path] = pos.astype(np.int64)
        deletes.append(delete_file(tmp_path / f"x{j}.parquet", named))
    wanted_keys = rng.choice(25000, 300, replace=False).astype(np.int64)  # some in no file
    wanted = pa.array(wanted_keys[rng.permutation(300)]).cast(pa.int64())
    truth = expected(files, gone, set(wanted_keys.tolist()))
    assert truth and len(truth) >= 2

    infos = [f for f, _ in files]
    cache = ColumnCache()
    monkeypatch.setattr(file_cache, "_cache", cache)
    for ratio in (10**9, 1):  # every file scanned; the files bigger than the batch indexed
        monkeypatch.setattr(locate, "INDEX_RATIO", ratio)
        found = locate.locate_keys([wanted], ["id"], infos, deletes)
        assert {p: v.tolist() for p, v in found.items()} == truth
    indexed = [k for k in cache._entries if k[1] == ("\0index", "id")]
    assert len(indexed) == 2  # not the 40-row file: smaller than the batch's 300 keys


def test_a_key_index_is_shared_read_only_and_finds_every_repeat(tmp_path: Path) -> None:
    keys = np.array([9, 3, 3, 7, 1, 3], np.int64)
    f = data_file(tmp_path / "d.parquet", keys, pa.int64())
    cache = ColumnCache()
    index = cache.key_index(f.path, "id")
    assert index is not None and cache.key_index(f.path, "id") is index
    assert index.positions(np.array([1, 3, 4], np.int64)).tolist() == [1, 2, 4, 5]
    assert index.positions(np.array([2, 10], np.int64)).tolist() == []
    with pytest.raises(ValueError):
        index.values[0] = 0
    with pytest.raises(ValueError):
        index.rows[0] = 0


def test_a_column_that_cannot_be_indexed_is_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text keys, and an integer column with nulls (a key column added after the file
    was written reads as nulls), have no index; locating still finds the rows."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["b", "a", "c"], "n": pa.array([1, None, 3], pa.int64())}), path)
    cache = ColumnCache()
    uri = f"file://{path}"
    assert cache.key_index(uri, "id") is None and cache.key_index(uri, "n") is None
    f = DataFileInfo(uri, 3, path.stat().st_size)
    monkeypatch.setattr(locate, "INDEX_RATIO", 1)
    found = locate.locate_keys([pa.array([3, 4], pa.int64())], ["n"], [f], [])
    assert {p: v.tolist() for p, v in found.items()} == {uri: [2]}


def test_a_file_whose_index_would_not_be_kept_is_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index the cache would not keep would be sorted again at every batch: such a
    file has none, and is searched as it is."""
    keys = np.arange(1000, dtype=np.int64)[::-1].copy()
    f = data_file(tmp_path / "d.parquet", keys, pa.int64())
    small = ColumnCache(max_bytes=4 * 12 * 999)  # room for the column, not its index
    assert small.key_index(f.path, "id") is None
    big = ColumnCache(max_bytes=4 * 12 * 1000)
    index = big.key_index(f.path, "id")
    assert index is not None and index.rows.dtype == np.int32
    monkeypatch.setattr(locate, "INDEX_RATIO", 1)
    for cache in (small, big):
        monkeypatch.setattr(file_cache, "_cache", cache)
        found = locate.locate_keys([pa.array([5, 998, 2000], pa.int64())], ["id"], [f], [])
        assert {p: v.tolist() for p, v in found.items()} == {f.path: [1, 994]}


def _three_files(tmp_path: Path) -> tuple[list[DataFileInfo], list[DeleteFileInfo]]:
    rng = np.random.default_rng(7)
    files = [
        data_file(tmp_path / f"d{i}.parquet", rng.choice(10**6, n, replace=False), pa.int64())
        for i, n in enumerate([4000, 2000, 4])
    ]
    deletes = [delete_file(tmp_path / "x.parquet", {files[0].path: np.arange(0, 4000, 9)})]
    return files, deletes


def test_reading_ahead_leaves_a_batch_nothing_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After :func:`locate.warm`, locating a small batch's keys in the same files reads
    no file: every look-up is a hit, and the rows found are those found cold."""
    files, deletes = _three_files(tmp_path)
    keys = pa.array(read_ids(files[0])[:5].tolist() + read_ids(files[2])[:1].tolist() + [-1])
    cold = ColumnCache()
    monkeypatch.setattr(file_cache, "_cache", cold)
    truth = locate.locate_keys([keys], ["id"], files, deletes)
    assert cold.misses > 0 and len(truth) == 2

    warm = ColumnCache()
    monkeypatch.setattr(file_cache, "_cache", warm)
    assert locate.warm(["id"], files, deletes, lambda: False)
    misses = warm.misses
    found = locate.locate_keys([keys], ["id"], files, deletes)
    assert warm.misses == misses  # nothing read
    assert {p: v.tolist() for p, v in found.items()} == {p: v.tolist() for p, v in truth.items()}
    indexed = {k[0] for k in warm._entries if k[1] == ("\0index", "id")}
    assert indexed == {files[0].path, files[1].path}  # the 4-row file is scanned


def test_reading_ahead_stops_when_asked_and_keeps_half_the_cache_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, deletes = _three_files(tmp_path)
    cache = ColumnCache()
    monkeypatch.setattr(file_cache, "_cache", cache)
    asked = iter([False, False, True])  # the delete file, the first data file, then stop
    assert not locate.warm(["id"], files, deletes, lambda: next(asked))
    read = {k[0] for k in cache._entries}
    assert read == {deletes[0].path, files[0].path}

    # Room for the smaller files only: the 4,000-row file (80,000 bytes with its
    # index, more than a quarter of the cache) is left for the batch that needs it,
    # and nothing already held is pushed out.
    small = ColumnCache(max_bytes=200_000)
    monkeypatch.setattr(file_cache, "_cache", small)
    small.read(files[2].path, ["v"])  # something a batch read
    assert locate.warm(["id"], files, deletes, lambda: False)
    held = {k[0] for k in small._entries}
    assert files[0].path not in held and {files[1].path, files[2].path} <= held
    assert (files[2].path, ("v",)) in small._entries
    assert small._bytes <= small.max_bytes // 2


def read_ids(f: DataFileInfo) -> np.ndarray:
    ids: np.ndarray = pq.read_table(f.path.removeprefix("file://"), columns=["id"])["id"].to_numpy()
    return ids
