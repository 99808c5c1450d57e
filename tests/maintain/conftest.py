"""Fixtures: the real SQLite catalog and ``orders`` table of tests/sink, and helpers
that give a table many small data files and position-delete files, as the apply does."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.table import Table

from sparkapply.apply.write.parquet import TableWriter
from sparkapply.datafiles import data_directory
from sparkapply.lsn import Lsn
from sparkapply.sink import applied_lsn, commit_files, read_table
from sparkapply.sink.maintenance import list_files
from tests.sink.conftest import catalog, catalog_properties, orders  # noqa: F401
from tests.sink.executor_files import ORDERS_ARROW, write_orders


def rows(table: Table, snapshot_id: int | None = None) -> list[tuple[object, ...]]:
    """Every row, sorted: what compaction and expiry must never change."""
    t = read_table(table, snapshot_id=snapshot_id)
    return sorted(tuple(r.values()) for r in t.to_pylist())


def files(table: Table) -> set[str]:
    """Every file under the table's location."""
    return {path for path, _size, _mtime in list_files(table.location())}


def delete_positions(table: Table, positions: dict[str, Sequence[int]]) -> list:  # type: ignore[type-arg]
    info = TableWriter(data_directory(table), ORDERS_ARROW).write_deletes(
        {p: np.array(v, np.int64) for p, v in positions.items()}
    )
    assert info is not None
    return [info]


def churn(table: Table, batches: int, *, start_lsn: int = 1) -> dict[int, tuple[str, int]]:
    """``batches`` apply-like commits: each inserts 10 new ids and updates one older id
    (new version appended, old position deleted). Returns where each live id is."""
    where: dict[int, tuple[str, int]] = {}
    lsn = start_lsn
    next_id = 1
    for b in range(batches):
        ids = list(range(next_id, next_id + 10))
        next_id += 10
        deletes = []
        if b > 0:
            victim = ids[0] - 10  # an id of the previous batch
            old_path, old_pos = where[victim]
            ids.append(victim)
            deletes = delete_positions(table, {old_path: [old_pos]})
        path = write_orders(table, ids, note=f"batch {b}")
        commit_files(table, added=[path], deletes=deletes, lsn=Lsn(lsn))
        lsn += 1
        for pos, i in enumerate(ids):
            where[i] = (_uri(path), pos)
    assert applied_lsn(table) == Lsn(lsn - 1)
    return where


def _uri(path: str) -> str:
    return "file://" + path if path.startswith("/") else path


def arrow_ids(t: pa.Table) -> list[int]:
    return sorted(t.column("id").to_pylist())
