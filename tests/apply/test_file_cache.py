"""The process's cache of immutable files' columns: a hit returns what the file holds,
and the cache stays within its bytes, least recently used out first."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.apply.write.file_cache import ColumnCache
from sparkapply.apply.write.parquet import read_parquet


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


def test_a_delete_file_is_kept_grouped_by_the_data_file_it_names(tmp_path: Path) -> None:
    """Positions come back per data file, whatever order the file lists them in, and
    a second ask is a hit that cannot be changed by its caller."""
    path = str(tmp_path / "deletes.parquet")
    names = ["b.parquet", "a.parquet", "b.parquet", "c.parquet", "a.parquet", "b.parquet"]
    positions = [7, 3, 1, 0, 9, 4]
    pq.write_table(pa.table({"file_path": names, "pos": pa.array(positions, pa.int64())}), path)
    cache = ColumnCache()
    grouped = cache.positions(path)
    assert {p: a.tolist() for p, a in grouped.items()} == {
        "a.parquet": [3, 9],
        "b.parquet": [7, 1, 4],
        "c.parquet": [0],
    }
    assert cache.positions(path) is grouped and (cache.misses, cache.hits) == (1, 1)
    with pytest.raises(ValueError, match="read-only"):
        grouped["a.parquet"][0] = 5


def test_read_parquet_gives_the_columns_asked_in_order_and_nulls_for_new_ones(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "a.parquet", 3)
    assert read_parquet(path).column_names == ["id", "v"]
    both = read_parquet(path, ["v", "id"])
    assert both.column_names == ["v", "id"] and both.column("id").to_pylist() == [0, 1, 2]
    added = read_parquet(path, ["id", "added_later"])
    assert added.column_names == ["id", "added_later"]
    assert added.column("added_later").to_pylist() == [None, None, None]
