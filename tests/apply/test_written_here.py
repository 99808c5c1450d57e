"""A file a task writes is in its process's cache as it would read back (file_cache.py,
WRITTEN HERE): the key columns of a data file, for every column type the mapping
makes, and a delete file's positions; and locating keys in them finds what a cold
read finds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sparkapply.apply.write import file_cache, locate
from sparkapply.apply.write.effect import Target
from sparkapply.apply.write.file_cache import ColumnCache
from sparkapply.apply.write.parquet import TableWriter, read_parquet
from sparkapply.convert.types import relation_columns
from sparkapply.convert.values import arrow_schema
from sparkapply.datafiles import DataFileInfo
from tests.apply.test_parquet_dictionary import column
from tests.convert.test_schema import ALL_TYPES

SCHEMA = arrow_schema(relation_columns(ALL_TYPES))


@pytest.fixture()
def cache(monkeypatch: pytest.MonkeyPatch) -> ColumnCache:
    fresh = ColumnCache()
    monkeypatch.setattr(file_cache, "_cache", fresh)
    return fresh


@pytest.mark.parametrize("key", [f.name for f in SCHEMA])
def test_a_written_key_column_is_held_as_it_reads_back(
    tmp_path: Path, cache: ColumnCache, key: str
) -> None:
    table = pa.table({f.name: column(f, False) for f in SCHEMA}, schema=SCHEMA)
    target = Target(SCHEMA, (), (), TableWriter(str(tmp_path), SCHEMA), key_names=(key,))
    target.write_rows(table.slice(5))
    (path,) = target.result.added
    held = cache.read(path, [key])
    assert cache.misses == 0, "the written file was read back"
    read = read_parquet(path, [key])
    assert held.schema == read.schema
    assert held.equals(read)


def test_written_positions_are_held_as_they_read_back(tmp_path: Path, cache: ColumnCache) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), False)])
    target = Target(schema, (), (), TableWriter(str(tmp_path), schema), key_names=("id",))
    rng = np.random.default_rng(3)
    named = {f"file:///d/{i}.parquet": rng.choice(1000, 50, replace=False) for i in range(3)}
    target.write_positions(named)
    (info,) = target.result.deletes
    held = cache.positions(info.path)
    assert cache.misses == 0
    cold = ColumnCache().positions(info.path)
    assert held.keys() == cold.keys()
    for p in cold:
        assert held[p].dtype == cold[p].dtype and held[p].tolist() == cold[p].tolist()
        assert not held[p].flags.writeable


def test_locating_in_written_files_finds_what_a_cold_read_finds(
    tmp_path: Path, cache: ColumnCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []

    def counted(path: str, columns: list[str] | None = None) -> pa.Table:
        reads.append(path)
        return read_parquet(path, columns)

    monkeypatch.setattr(file_cache, "read_parquet", counted)
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.large_string())])
    target = Target(schema, (), (), TableWriter(str(tmp_path), schema), key_names=("id",))
    keys = np.random.default_rng(5).permutation(5000)
    target.write_rows(pa.table({"id": keys, "v": [str(k) for k in keys]}, schema=schema))
    (path,) = target.result.added
    target.write_positions({path: np.arange(0, 5000, 7)})
    files = [DataFileInfo(path, 5000, 1)]
    deletes = target.result.deletes
    wanted = [pa.array([int(k) for k in keys[:40]] + [99_999], pa.int64())]
    found = locate.locate_keys(wanted, ["id"], files, deletes)
    assert not reads, "a file written here was read back"
    monkeypatch.setattr(file_cache, "_cache", ColumnCache())
    cold = locate.locate_keys(wanted, ["id"], files, deletes)
    assert len(reads) == 2  # the data file's key, the delete file's positions
    assert {p: v.tolist() for p, v in cold.items()} == {p: v.tolist() for p, v in found.items()}
    deleted = set(range(0, 5000, 7))
    assert found[path].tolist() == sorted(i for i in range(40) if i not in deleted)


def test_a_table_without_a_key_keeps_nothing(tmp_path: Path, cache: ColumnCache) -> None:
    schema = pa.schema([pa.field("id", pa.int64())])
    target = Target(schema, (), (), TableWriter(str(tmp_path), schema))
    target.write_rows(pa.table({"id": [1, 2, 3]}, schema=schema))
    target.write_positions({"file:///d/x.parquet": np.array([1])})
    assert not cache._entries
