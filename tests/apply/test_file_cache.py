"""The process's cache of immutable files' columns: a hit returns what the file holds,
and the cache stays within its bytes, least recently used out first."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sparkapply.apply.write.file_cache import ColumnCache


def write(path: Path, n: int) -> str:
    pq.write_table(pa.table({"id": pa.array(range(n), pa.int64()), "v": ["x"] * n}), path)
    return str(path)


def test_a_second_read_is_a_hit_with_the_same_columns(tmp_path: Path) -> None:
    cache = ColumnCache()
    path = write(tmp_path / "a.parquet", 10)
    first = cache.read(path, ["id"])
    again = cache.read(path, ["id"])
    assert (cache.misses, cache.hits) == (1, 1)
    assert again.equals(first) and again.column_names == ["id"]
    assert again.column("id").to_pylist() == list(range(10))
    both = cache.read(path, ["v", "id"])  # other columns: another entry
    assert both.column_names == ["v", "id"] and cache.misses == 2


def test_the_cache_keeps_within_its_bytes(tmp_path: Path) -> None:
    paths = [write(tmp_path / f"{i}.parquet", 1000) for i in range(6)]
    one = pq.read_table(paths[0], columns=["id"]).nbytes
    cache = ColumnCache(max_bytes=4 * one)
    for p in paths:
        cache.read(p, ["id"])
    cache.read(paths[-1], ["id"])  # the newest is kept
    assert cache.hits == 1
    cache.read(paths[0], ["id"])  # the oldest went
    assert cache.hits == 1 and cache.misses == 7
    big = write(tmp_path / "big.parquet", 5000)  # over a quarter of the cache: not kept
    cache.read(big, ["id"])
    cache.read(big, ["id"])
    assert cache.misses == 9
