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

The cache holds at most ``MAX_BYTES`` of Arrow data, least recently used out first; a
read larger than a quarter of that is not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import pyarrow as pa

from sparkapply.apply.write.parquet import read_parquet

MAX_BYTES = 64 * 1024 * 1024


class ColumnCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, tuple[str, ...]], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def read(self, path: str, columns: Sequence[str]) -> pa.Table:
        """``columns`` of the file at ``path`` (see :func:`read_parquet`)."""
        key = (path, tuple(columns))
        with self._lock:
            table = self._entries.get(key)
            if table is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return table
        table = read_parquet(path, columns)
        size = table.nbytes
        with self._lock:
            self.misses += 1
            if size <= self.max_bytes // 4 and key not in self._entries:
                self._entries[key] = table
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, old = self._entries.popitem(last=False)
                    self._bytes -= old.nbytes
        return table


_cache = ColumnCache()


def read_columns(path: str, columns: Sequence[str]) -> pa.Table:
    """``columns`` of an immutable data or delete file, from this process's cache."""
    return _cache.read(path, columns)
