"""Row deltas: data files and position-delete files in one snapshot (merge-on-read),
read back by pyiceberg and by DuckDB's iceberg extension."""

from __future__ import annotations

import numpy as np
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table

from sparkapply.apply.write.parquet import TableWriter
from sparkapply.datafiles import data_directory
from sparkapply.errors import ErrorKind
from sparkapply.lsn import Lsn
from sparkapply.sink import (
    CommitConflictError,
    applied_lsn,
    commit_files,
    current_data_files,
    read_table,
)
from sparkapply.sink.files import delete_file_infos, live_files
from tests.readers import read_with_duckdb

from .conftest import ORDERS
from .executor_files import ORDERS_ARROW, write_orders


def ids(table: Table) -> list[int]:
    return sorted(read_table(table).column("id").to_pylist())


def duck_ids(table: Table) -> list[int]:
    return sorted(read_with_duckdb(table).column("id").to_pylist())


def deletes(table: Table, positions: dict[str, list[int]]) -> list:  # type: ignore[type-arg]
    info = TableWriter(data_directory(table), ORDERS_ARROW).write_deletes(
        {p: np.array(v) for p, v in positions.items()}
    )
    assert info is not None
    return [info]


def summary(table: Table) -> dict[str, str]:
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return dict(snapshot.summary.additional_properties)


def test_updates_as_new_rows_plus_position_deletes(orders: Table) -> None:
    first = write_orders(orders, [1, 2, 3, 4])
    commit_files(orders, added=[first], lsn=Lsn("0/10"))
    # "update" 2 and 4, "delete" 3: new versions appended, old positions deleted.
    new = write_orders(orders, [2, 4], note="v2")
    commit_files(orders, added=[new], deletes=deletes(orders, {first: [1, 2, 3]}), lsn=Lsn("0/20"))
    rows = read_table(orders).sort_by("id").to_pylist()
    assert [(r["id"], r["note"]) for r in rows] == [(1, "order 1"), (2, "v2"), (4, "v2")]
    assert duck_ids(orders) == [1, 2, 4]
    s = summary(orders)
    assert s["added-position-deletes"] == "3"
    assert s["total-position-deletes"] == "3"
    assert s["total-delete-files"] == "1"
    assert s["total-data-files"] == "2"
    assert s["sparkapply.lsn"] == "0/20"
    assert applied_lsn(orders) == Lsn("0/20")
    snapshot = orders.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "overwrite"
    contents = sorted(m.content for m in snapshot.manifests(orders.io))
    assert contents == [ManifestContent.DATA, ManifestContent.DATA, ManifestContent.DELETES]
    # The delete manifest carries this snapshot's sequence number.
    manifests = snapshot.manifests(orders.io)
    delete_manifest = next(m for m in manifests if m.content == ManifestContent.DELETES)
    assert delete_manifest.sequence_number == snapshot.sequence_number


def test_deletes_accumulate_across_snapshots(orders: Table) -> None:
    first = write_orders(orders, list(range(1, 11)))
    commit_files(orders, added=[first], lsn=Lsn("0/10"))
    commit_files(orders, added=[], deletes=deletes(orders, {first: [0]}), lsn=Lsn("0/20"))
    second = write_orders(orders, [1], note="back")
    commit_files(orders, added=[second], deletes=deletes(orders, {first: [5, 9]}), lsn=Lsn("0/30"))
    assert ids(orders) == [1, 2, 3, 4, 5, 7, 8, 9]
    assert duck_ids(orders) == [1, 2, 3, 4, 5, 7, 8, 9]
    live = live_files(orders)
    assert len(live.data) == 2 and len(live.deletes) == 2
    infos = delete_file_infos(live)
    assert all(i.lower_path == i.upper_path == first for i in infos)
    assert summary(orders)["total-records"] == "11"
    assert summary(orders)["total-position-deletes"] == "3"


def test_truncate_drops_data_and_delete_files(orders: Table) -> None:
    first = write_orders(orders, [1, 2, 3])
    commit_files(orders, added=[first], lsn=Lsn("0/10"))
    commit_files(orders, added=[], deletes=deletes(orders, {first: [1]}), lsn=Lsn("0/20"))
    after = write_orders(orders, [7])
    commit_files(orders, added=[after], truncate=True, lsn=Lsn("0/30"))
    assert ids(orders) == [7]
    assert duck_ids(orders) == [7]
    live = live_files(orders)
    assert list(live.data) == [after] and live.deletes == []
    s = summary(orders)
    assert s["total-delete-files"] == "0" and s["total-position-deletes"] == "0"
    assert s["total-data-files"] == "1" and s["total-records"] == "1"


def test_a_row_delta_on_a_moved_table_is_a_conflict(catalog: Catalog, orders: Table) -> None:
    first = write_orders(orders, [1, 2])
    commit_files(orders, added=[first], lsn=Lsn("0/10"))
    stale = catalog.load_table(ORDERS)
    commit_files(orders, added=[write_orders(orders, [3])], lsn=Lsn("0/20"))
    with pytest.raises(CommitConflictError) as info:
        commit_files(stale, added=[], deletes=deletes(stale, {first: [0]}), lsn=Lsn("0/30"))
    assert info.value.kind is ErrorKind.TRANSIENT
    fresh = catalog.load_table(ORDERS)
    assert ids(fresh) == [1, 2, 3]
    assert applied_lsn(fresh) == Lsn("0/20")


def test_data_file_infos_carry_key_bounds(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [5, 9, 7])], lsn=Lsn("0/10"))
    (info,) = current_data_files(orders, "id")
    assert (info.key_lower, info.key_upper) == (5, 9)
