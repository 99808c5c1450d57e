"""Columns of data and delete files, kept in this process between batches.

A data or delete file is never rewritten in place (each has a name of its own), so
what a read returned stays true for as long as anyone asks. Locating the rows a batch
replaces reads the key columns of the table's live files, and small batches in a
steady stream read the same files batch after batch: a table of a few hot rows gets
one new small file per batch until compaction folds them, and every batch read them
all again (19 of a task's 23 ms at 1,000 pgbench transactions a second). An
executor's Python worker is reused between tasks and keeps its cache (the job of such
a batch: 0.19 s at the median, 0.16 s with it); the driver keeps one for the batches
it folds itself (``driver.py``, SMALL BATCHES).

A position-delete file is kept grouped by the data file it names
(:func:`deleted_positions`): each batch asks the same delete files which positions of
its candidate files they delete, and grouping them again every time (a string unique
and a mask per data file) was half the time spent locating keys at 1,000 pgbench
transactions a second.

A big file's integer key is also kept sorted (:func:`key_index`): a batch of a few
thousand keys against a table of a million rows searched each of the file's values
in the batch's keys, a fifth of the race's scatter batch on the driver in a profile
(py-spy), and built a live-row mask of the whole file. Searching the batch's keys in
the file's sorted values is a few thousand binary searches: 20,000 keys in a file of a
million rows with 40 delete files naming it, timed ad hoc, took 102 ms scanned and
11 ms searched when the file's keys are in random order, 35 and 10 ms when they are
in order. The sort is paid once per file, not once per batch.

WRITTEN HERE
    A file this process writes is put in the cache as it is written, as its writer
    says the file holds it (``parquet.py``, ``TableWriter``; asked by ``effect.py``,
    ``Target``, for a table with a key): a data file's key columns and a delete
    file's positions. In a steady stream each batch searches the files the batch
    before wrote, and read them back: at 1,000 pgbench transactions a second, reading
    files was a sixteenth of the apply thread's time in a profile (py-spy), most of it
    those files.

The cache holds at most ``MAX_BYTES`` of Arrow and NumPy data, least recently used out
first; a read larger than a quarter of that is not kept. What is read ahead of need
(``locate.warm``, while the subscriber is idle) fills at most half of it
(:func:`room_to_warm`), so it never pushes out what batches read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.apply.write.parquet import read_parquet
from sparkapply.plan.keys import as_int64, ascending

MAX_BYTES = 64 * 1024 * 1024


Positions: TypeAlias = Mapping[str, np.ndarray]
"""A delete file's positions (int64, as written) by the data file they name."""


@dataclass(frozen=True, slots=True)
class KeyIndex:
    """A data file's integer key column, sorted: ``values[i]`` is at row ``rows[i]``."""

    values: np.ndarray  # int64, ascending
    rows: np.ndarray  # int32 positions in the file

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """The rows holding one of ``keys`` (int64, ascending), ascending."""
        lo = np.searchsorted(self.values, keys, "left")
        hi = np.searchsorted(self.values, keys, "right")
        n = hi - lo
        if not n.any():
            return np.zeros(0, np.int64)
        if n.max() == 1:  # a key at most once in the file: the usual case
            at = self.rows[lo[n == 1]]
        else:
            at = np.concatenate([self.rows[a:b] for a, b in zip(lo[n > 0], hi[n > 0], strict=True)])
        return ascending(at).astype(np.int64)


_Value: TypeAlias = pa.Table | Positions | KeyIndex
_GROUPED = ("\0grouped",)  # the key of a delete file's grouped positions
_INDEX = "\0index"  # with a column name, the key of its KeyIndex


def _nbytes(value: _Value) -> int:
    if isinstance(value, pa.Table):
        return int(value.nbytes)
    if isinstance(value, KeyIndex):
        return int(value.values.nbytes + value.rows.nbytes)
    return sum(len(p) + a.nbytes for p, a in value.items())


class ColumnCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, tuple[str, ...]], tuple[_Value, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def read(self, path: str, columns: Sequence[str]) -> pa.Table:
        """``columns`` of the file at ``path`` (see :func:`read_parquet`)."""
        value = self._get((path, tuple(columns)), lambda: read_parquet(path, columns))
        assert isinstance(value, pa.Table)
        return value

    def positions(self, path: str) -> Positions:
        """The positions the delete file at ``path`` deletes, by data file."""
        value = self._get((path, _GROUPED), lambda: _grouped(read_parquet(path, _POSITION)))
        assert not isinstance(value, pa.Table | KeyIndex)
        return value

    def key_index(self, path: str, column: str) -> KeyIndex | None:
        """The integer ``column`` of the data file at ``path``, sorted; None when the
        column is not integers without nulls, or when its index would be too big to
        keep (sorted again at every batch, it would cost more than the scan it saves):
        the caller searches the column as it is."""
        values = as_int64(self.read(path, [column]).column(column))
        if values is None or len(values) * _INDEX_BYTES_PER_ROW > self.max_bytes // 4:
            return None
        value = self._get((path, (_INDEX, column)), lambda: _sorted(values))
        assert isinstance(value, KeyIndex)
        return value

    def room_to_warm(self) -> int:
        """Bytes a read ahead of need may still add: up to half the cache is filled
        that way, and nothing is pushed out for it."""
        with self._lock:
            return max(0, min(self.max_bytes // 2 - self._bytes, self.max_bytes // 4))

    def remember(self, path: str, columns: Sequence[str], table: pa.Table) -> None:
        """Keep ``table`` as what reading ``columns`` of the file at ``path`` gives:
        the file was just written here, from it (see WRITTEN HERE)."""
        self._put((path, tuple(columns)), table)

    def remember_positions(self, path: str, positions: Positions) -> None:
        """Keep ``positions`` (sorted int64 per data file) as what the delete file at
        ``path``, just written here from them, deletes."""
        for pos in positions.values():
            pos.flags.writeable = False  # shared by every batch that asks
        self._put((path, _GROUPED), positions)

    def _get(self, key: tuple[str, tuple[str, ...]], load: Callable[[], _Value]) -> _Value:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[0]
        value = load()
        with self._lock:
            self.misses += 1
        self._put(key, value)
        return value

    def _put(self, key: tuple[str, tuple[str, ...]], value: _Value) -> None:
        size = _nbytes(value)
        with self._lock:
            if size <= self.max_bytes // 4 and key not in self._entries:
                self._entries[key] = (value, size)
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, (_, old) = self._entries.popitem(last=False)
                    self._bytes -= old


_POSITION = ["file_path", "pos"]


_INDEX_BYTES_PER_ROW = 12  # an int64 value and an int32 row number


def _sorted(values: np.ndarray) -> KeyIndex:
    rows = np.argsort(values, kind="stable").astype(np.int32)  # a file has < 2**31 rows
    index = KeyIndex(values[rows], rows)
    index.values.flags.writeable = False  # shared by every batch that asks
    index.rows.flags.writeable = False
    return index


def _grouped(t: pa.Table) -> Positions:
    """Each named data file's positions, in the file's order (sorted, as the spec asks
    a writer to; not relied upon). A null path (the spec requires one) names nothing."""
    if t.column("file_path").null_count:
        t = t.filter(pc.is_valid(t.column("file_path")))
    paths = t.column("file_path").combine_chunks().dictionary_encode()
    codes = paths.indices.to_numpy(zero_copy_only=False)
    pos = t.column("pos").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    order = np.argsort(codes, kind="stable")
    codes, pos = codes[order], pos[order]
    starts = np.flatnonzero(np.diff(codes)) + 1
    pos.flags.writeable = False  # shared by every batch that asks
    names = paths.dictionary.to_pylist()
    return {
        names[codes[begin]]: part
        for begin, part in zip([0, *starts.tolist()], np.split(pos, starts), strict=True)
        if len(part)
    }


_cache = ColumnCache()


def read_columns(path: str, columns: Sequence[str]) -> pa.Table:
    """``columns`` of an immutable data or delete file, from this process's cache."""
    return _cache.read(path, columns)


def key_index(path: str, column: str) -> KeyIndex | None:
    """The integer key ``column`` of an immutable data file, sorted, from this process's
    cache (see :meth:`ColumnCache.key_index`)."""
    return _cache.key_index(path, column)


def remember_columns(path: str, columns: Sequence[str], table: pa.Table) -> None:
    """``table`` is ``columns`` of the file at ``path``, just written by this process."""
    _cache.remember(path, columns, table)


def remember_positions(path: str, positions: Positions) -> None:
    """``positions`` are what the delete file at ``path``, just written here, deletes."""
    _cache.remember_positions(path, positions)


def room_to_warm() -> int:
    """Bytes this process's cache may still take of reads ahead of need."""
    return _cache.room_to_warm()


def key_index_bytes(rows: int) -> int:
    """What a file's integer key and its sorted index take in the cache."""
    return rows * (8 + _INDEX_BYTES_PER_ROW)


def deleted_positions(path: str) -> Positions:
    """The positions an immutable position-delete file deletes, by data file, from this
    process's cache."""
    return _cache.positions(path)
