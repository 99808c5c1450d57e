from __future__ import annotations

import datetime as dt
import decimal
import os
import pickle
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table

from sparkapply.datafiles import data_directory
from sparkapply.errors import ErrorKind, SinkError
from sparkapply.lsn import Lsn
from sparkapply.sink import (
    LSN_SUMMARY_KEY,
    LSN_TABLE_PROPERTY,
    CommitConflictError,
    CommitOutcomeUnknownError,
    applied_lsn,
    commit_files,
    current_data_files,
    current_snapshot_id,
    open_catalog,
    read_table,
    remove_orphans,
)
from sparkapply.sink.files import delete_file_infos, live_files
from sparkapply.sink.footers import _describe, as_table_uri

from .conftest import ORDERS
from .executor_files import ORDERS_ARROW, UTC, order, to_arrow, write_data_file, write_orders
from .merge_on_read import delete_row


def ids(table: Table) -> list[int]:
    return sorted(read_table(table).column("id").to_pylist())


def local(path: str) -> str:
    return urlsplit(path).path


def snapshot_count(table: Table) -> int:
    return len(table.metadata.snapshots)


def test_append_round_trip_of_every_type(orders: Table) -> None:
    path = write_orders(orders, [1, 2])
    snapshot_id = commit_files(orders, added=[path], lsn=Lsn("0/16B3748"))

    snapshot = orders.current_snapshot()
    assert snapshot is not None and snapshot.snapshot_id == snapshot_id
    assert snapshot.summary is not None
    assert snapshot.summary.operation.value == "append"
    assert snapshot.summary[LSN_SUMMARY_KEY] == "0/16B3748"
    assert orders.properties[LSN_TABLE_PROPERTY] == "0/16B3748"

    result = read_table(orders).sort_by("id")
    assert result.schema.field("ref").type == pa.uuid()
    assert result.schema.field("placed_at").type == pa.timestamp("us", tz="UTC")
    row = result.to_pylist()[0]
    assert row == {
        "id": 1,
        "amount": decimal.Decimal("1.01"),
        "placed_at": dt.datetime(2024, 1, 1, 0, 0, 1, tzinfo=UTC),
        "ref": uuid.UUID(int=1),
        "at": dt.time(12, 0, 1),
        "qty": 10,
        "note": "order 1",
    }
    assert [f.path for f in current_data_files(orders)] == [path]


def test_fixed_size_binary_is_accepted_for_uuid(orders: Table) -> None:
    schema = ORDERS_ARROW.set(ORDERS_ARROW.get_field_index("ref"), pa.field("ref", pa.binary(16)))
    path = write_data_file(orders, to_arrow([order(7)], schema))
    commit_files(orders, added=[path], lsn=Lsn("0/1"))
    assert read_table(orders).column("ref").to_pylist() == [uuid.UUID(int=7)]


def test_overwrite_replaces_rewritten_files_in_one_snapshot(orders: Table) -> None:
    first = write_orders(orders, [1, 2, 3])
    other = write_orders(orders, [4])
    commit_files(orders, added=[first, other], lsn=Lsn("0/10"))
    before = current_snapshot_id(orders)

    # Copy-on-write: row 2 deleted, row 3 updated, row 5 inserted.
    rewritten = write_data_file(orders, to_arrow([order(1), order(3, note="changed")]))
    inserted = write_orders(orders, [5])
    snapshot_id = commit_files(
        orders,
        added=[rewritten, inserted],
        removed=[first],
        lsn=Lsn("0/20"),
        base_snapshot_id=before,
    )

    snapshot = orders.current_snapshot()
    assert snapshot is not None and snapshot.snapshot_id == snapshot_id
    assert snapshot.parent_snapshot_id == before
    assert snapshot.summary is not None
    assert snapshot.summary.operation.value == "overwrite"
    assert snapshot.summary["deleted-data-files"] == "1"
    assert snapshot.summary["added-data-files"] == "2"
    assert snapshot.summary["total-records"] == "4"
    assert ids(orders) == [1, 3, 4, 5]
    notes = {r["id"]: r["note"] for r in read_table(orders).to_pylist()}
    assert notes[3] == "changed"
    assert {f.path for f in current_data_files(orders)} == {other, rewritten, inserted}
    # Time travel still sees the old file.
    assert sorted(read_table(orders, snapshot_id=before).column("id").to_pylist()) == [1, 2, 3, 4]


def test_delete_only_batch(orders: Table) -> None:
    path = write_orders(orders, [1])
    commit_files(orders, added=[path], lsn=Lsn("0/10"))
    commit_files(orders, added=[], removed=[path], lsn=Lsn("0/20"))
    assert ids(orders) == []
    assert applied_lsn(orders) == Lsn("0/20")


def test_truncate_removes_every_file_and_adds_the_new_rows(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1, 2])], lsn=Lsn("0/10"))
    commit_files(orders, added=[write_orders(orders, [3])], lsn=Lsn("0/20"))
    after_truncate = write_orders(orders, [7, 8])
    commit_files(orders, added=[after_truncate], truncate=True, lsn=Lsn("0/30"))
    assert ids(orders) == [7, 8]
    assert [f.path for f in current_data_files(orders)] == [after_truncate]

    commit_files(orders, added=[], truncate=True, lsn=Lsn("0/40"))
    assert ids(orders) == []
    assert applied_lsn(orders) == Lsn("0/40")


def test_truncate_of_an_empty_table(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], truncate=True, lsn=Lsn("0/10"))
    assert ids(orders) == [1]


def test_applied_lsn_survives_reopening_the_catalog(
    catalog_properties: dict[str, str], orders: Table
) -> None:
    assert applied_lsn(orders) is None
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("1/FF000000"))
    commit_files(orders, added=[write_orders(orders, [2])], lsn=Lsn("2/10"))

    reopened = open_catalog("test", catalog_properties).load_table(ORDERS)
    assert applied_lsn(reopened) == Lsn("2/10")
    assert ids(reopened) == [1, 2]


def test_applied_lsn_walks_back_past_other_writers(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    # Another tool commits (e.g. a compaction): its snapshot has no sparkapply.lsn.
    with orders.transaction() as txn, txn.update_snapshot().fast_append():
        pass
    snapshot = orders.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert LSN_SUMMARY_KEY not in snapshot.summary.additional_properties
    assert applied_lsn(orders) == Lsn("0/10")


def test_applied_lsn_falls_back_to_the_property_when_lineage_is_expired(
    catalog: Catalog, orders: Table
) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    ours = current_snapshot_id(orders)
    with orders.transaction() as txn, txn.update_snapshot().fast_append():
        pass
    assert ours is not None
    orders.maintenance.expire_snapshots().by_id(ours).commit()
    assert orders.metadata.snapshot_by_id(ours) is None
    assert applied_lsn(orders) == Lsn("0/10")

    reloaded = catalog.load_table(ORDERS)
    assert applied_lsn(reloaded) == Lsn("0/10")
    commit_files(reloaded, added=[], lsn=Lsn("0/20"))
    assert applied_lsn(catalog.load_table(ORDERS)) == Lsn("0/20")


def test_applied_lsn_can_be_set_by_an_operator(catalog: Catalog, orders: Table) -> None:
    # A table loaded by another tool: the operator records what it contains.
    with orders.transaction() as txn, txn.update_snapshot().fast_append():
        pass
    assert applied_lsn(orders) is None
    with orders.transaction() as txn:
        txn.set_properties({LSN_TABLE_PROPERTY: "5/0"})
    assert applied_lsn(catalog.load_table(ORDERS)) == Lsn("5/0")
    with orders.transaction() as txn:
        txn.set_properties({LSN_TABLE_PROPERTY: "garbage"})
    with pytest.raises(SinkError, match="invalid LSN"):
        applied_lsn(orders)


def test_empty_commit_records_the_lsn(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    snapshot_id = commit_files(orders, added=[], lsn=Lsn("0/20"))
    snapshot = orders.current_snapshot()
    assert snapshot is not None and snapshot.snapshot_id == snapshot_id
    assert snapshot.summary is not None
    assert snapshot.summary.operation.value == "append"
    assert snapshot.summary["added-data-files"] is None
    assert applied_lsn(orders) == Lsn("0/20")
    assert ids(orders) == [1]


def test_empty_commit_on_a_new_table(orders: Table) -> None:
    commit_files(orders, added=[], lsn=Lsn("0/5"))
    assert applied_lsn(orders) == Lsn("0/5")
    assert read_table(orders).num_rows == 0


def test_commit_of_a_missing_file_fails_cleanly(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    metadata_files = set(os.listdir(local(orders.location()) + "/metadata"))
    good = write_orders(orders, [2])
    missing = f"{data_directory(orders)}/{uuid.uuid4()}.parquet"

    with pytest.raises(SinkError, match="does not exist") as info:
        commit_files(orders, added=[good, missing], lsn=Lsn("0/20"))
    assert info.value.context["file"] == missing
    assert info.value.context["table"] == "public.orders"
    assert snapshot_count(orders) == 1
    assert applied_lsn(orders) == Lsn("0/10")
    assert set(os.listdir(local(orders.location()) + "/metadata")) == metadata_files
    assert ids(orders) == [1]


@pytest.mark.parametrize(
    ("field", "why"),
    [
        (pa.field("id", pa.int64(), nullable=True), "key column must be non-nullable"),
        (pa.field("placed_at", pa.timestamp("ns", tz="UTC")), "v2 has no nanoseconds"),
        (pa.field("placed_at", pa.timestamp("us")), "timestamp without zone"),
        (pa.field("amount", pa.decimal128(12, 3)), "wrong scale"),
        (pa.field("at", pa.time64("ns")), "time in ns"),
    ],
)
def test_commit_of_a_mismatching_file_fails_cleanly(
    orders: Table, field: pa.Field, why: str
) -> None:
    schema = ORDERS_ARROW.set(ORDERS_ARROW.get_field_index(field.name), field)
    data = to_arrow([order(1)], ORDERS_ARROW).cast(schema)
    path = write_data_file(orders, data)
    with pytest.raises(SinkError) as info:
        commit_files(orders, added=[path], lsn=Lsn("0/10"))
    assert info.value.context["file"] == path, why
    assert orders.current_snapshot() is None


def test_extra_columns_are_refused(orders: Table) -> None:
    schema = ORDERS_ARROW.append(pa.field("surprise", pa.int32()))
    path = write_data_file(orders, to_arrow([order(1)], schema))
    with pytest.raises(SinkError, match="surprise"):
        commit_files(orders, added=[path], lsn=Lsn("0/10"))


def test_missing_optional_columns_read_as_null(orders: Table) -> None:
    schema = pa.schema([ORDERS_ARROW.field("id"), ORDERS_ARROW.field("note")])
    path = write_data_file(orders, to_arrow([order(1)], schema))
    commit_files(orders, added=[path], lsn=Lsn("0/10"))
    assert read_table(orders).to_pylist()[0]["qty"] is None


def test_lsn_must_advance(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    for lsn in (Lsn("0/10"), Lsn("0/9")):
        with pytest.raises(SinkError, match="does not advance") as info:
            commit_files(orders, added=[], lsn=lsn)
        assert info.value.kind is ErrorKind.FATAL
    assert snapshot_count(orders) == 1


def test_removing_a_file_that_is_not_live_is_a_conflict(orders: Table) -> None:
    path = write_orders(orders, [1])
    commit_files(orders, added=[path], lsn=Lsn("0/10"))
    commit_files(orders, added=[], removed=[path], lsn=Lsn("0/20"))
    with pytest.raises(CommitConflictError) as info:
        commit_files(orders, added=[], removed=[path], lsn=Lsn("0/30"))
    assert info.value.kind is ErrorKind.TRANSIENT


def test_base_snapshot_mismatch_is_a_conflict(orders: Table) -> None:
    base = current_snapshot_id(orders)
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"), base_snapshot_id=base)
    with pytest.raises(CommitConflictError, match="since the batch was planned"):
        commit_files(orders, added=[], lsn=Lsn("0/20"), base_snapshot_id=base)


def test_concurrent_rewrite_of_a_removed_file_is_a_conflict(
    catalog: Catalog, orders: Table
) -> None:
    path = write_orders(orders, [1, 2])
    commit_files(orders, added=[path], lsn=Lsn("0/10"))
    stale = catalog.load_table(ORDERS)

    # Another writer (a compaction) replaces the file under us.
    compacted = write_orders(orders, [1, 2])
    commit_files(orders, added=[compacted], removed=[path], lsn=Lsn("0/11"))

    rewritten = write_orders(stale, [1])
    with pytest.raises(CommitConflictError):
        commit_files(stale, added=[rewritten], removed=[path], lsn=Lsn("0/20"))
    assert ids(catalog.load_table(ORDERS)) == [1, 2]
    assert remove_orphans(stale, [rewritten]) == [rewritten]
    assert not os.path.exists(local(rewritten))


def test_append_is_retried_on_top_of_a_compaction(catalog: Catalog, orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    stale = catalog.load_table(ORDERS)
    with orders.transaction() as txn, txn.update_snapshot().fast_append():
        pass  # another tool's snapshot, no LSN
    snapshot_id = commit_files(stale, added=[write_orders(stale, [2])], lsn=Lsn("0/20"))
    fresh = catalog.load_table(ORDERS)
    assert current_snapshot_id(fresh) == snapshot_id
    assert ids(fresh) == [1, 2]
    assert applied_lsn(fresh) == Lsn("0/20")


def test_a_second_subscriber_on_the_same_table_is_detected(catalog: Catalog, orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    stale = catalog.load_table(ORDERS)
    commit_files(orders, added=[write_orders(orders, [2])], lsn=Lsn("0/20"))
    with pytest.raises(SinkError, match="another writer committed LSN 0/20"):
        commit_files(stale, added=[write_orders(stale, [2])], lsn=Lsn("0/15"))


def test_remove_orphans_keeps_live_files_and_ignores_missing(orders: Table) -> None:
    live = write_orders(orders, [1])
    commit_files(orders, added=[live], lsn=Lsn("0/10"))
    orphan = write_orders(orders, [2])
    gone = f"{data_directory(orders)}/{uuid.uuid4()}.parquet"
    assert remove_orphans(orders, [live, orphan, gone]) == [orphan, gone]
    assert os.path.exists(local(live))
    assert not os.path.exists(local(orphan))


def test_plain_paths_are_recorded_as_file_uris(orders: Table, tmp_path: Path) -> None:
    path = local(write_orders(orders, [1]))
    commit_files(orders, added=[path], lsn=Lsn("0/10"))
    assert [f.path for f in current_data_files(orders)] == ["file://" + path]


def test_argument_checks(orders: Table) -> None:
    path = write_orders(orders, [1])
    with pytest.raises(ValueError, match="unique"):
        commit_files(orders, added=[path, path], lsn=Lsn("0/10"))
    with pytest.raises(ValueError, match="both added and removed"):
        commit_files(orders, added=[path], removed=[path], lsn=Lsn("0/10"))
    with pytest.raises(ValueError, match="must start with"):
        commit_files(orders, added=[path], lsn=Lsn("0/10"), extra_summary={"total-records": "1"})
    commit_files(orders, added=[path], lsn=Lsn("0/10"), extra_summary={"sparkapply.xid": "42"})
    snapshot = orders.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary["sparkapply.xid"] == "42"


def test_data_file_info_is_small_and_picklable(orders: Table) -> None:
    path = write_orders(orders, [1, 2, 3])
    commit_files(orders, added=[path], lsn=Lsn("0/10"))
    (info,) = current_data_files(orders)
    assert pickle.loads(pickle.dumps(info)) == info
    assert info.record_count == 3
    assert info.file_size_in_bytes == os.path.getsize(local(path))
    assert pq.read_metadata(info.path).num_rows == 3  # executors open it as given


def test_position_deletes_of_another_engine_are_honoured(orders: Table) -> None:
    # Spark or Trino in merge-on-read mode add delete files; sparkapply's executors see
    # them (DeleteFileInfo) and never count a deleted row as live.
    path = write_orders(orders, [1, 2])
    commit_files(orders, added=[path], lsn=Lsn("0/10"))
    delete_row(orders, path, 0)
    assert ids(orders) == [2]
    assert [f.path for f in current_data_files(orders)] == [path]
    (d,) = delete_file_infos(live_files(orders))
    assert d.lower_path <= path <= d.upper_path
    commit_files(orders, added=[write_orders(orders, [3])], lsn=Lsn("0/20"))  # appends still work
    assert ids(orders) == [2, 3]


class LostResponse(ConnectionError):
    """What a catalog client raises when the connection drops mid-commit."""


def test_a_commit_that_landed_despite_an_error_is_a_success(
    monkeypatch: pytest.MonkeyPatch, orders: Table
) -> None:
    real_commit = orders.catalog.commit_table

    def commit_then_lose_the_response(*args: Any) -> Any:
        real_commit(*args)
        raise LostResponse("connection reset after commit")

    monkeypatch.setattr(orders.catalog, "commit_table", commit_then_lose_the_response)
    snapshot_id = commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    monkeypatch.undo()
    assert current_snapshot_id(orders) == snapshot_id
    assert applied_lsn(orders) == Lsn("0/10")


def test_a_commit_with_an_unknown_outcome_says_so(
    monkeypatch: pytest.MonkeyPatch, catalog: Catalog, orders: Table
) -> None:
    def lose_the_request(*args: Any) -> Any:
        raise LostResponse("connection reset before commit")

    path = write_orders(orders, [1])
    monkeypatch.setattr(orders.catalog, "commit_table", lose_the_request)
    with pytest.raises(CommitOutcomeUnknownError) as info:
        commit_files(orders, added=[path], lsn=Lsn("0/10"))
    monkeypatch.undo()
    assert info.value.kind is ErrorKind.TRANSIENT
    assert "snapshot" in info.value.context
    table = catalog.load_table(ORDERS)
    assert applied_lsn(table) is None  # the restart path: it did not land, replay
    assert remove_orphans(table, [path]) == [path]


def test_a_file_is_described_as_pyiceberg_describes_it_and_checked_every_time(
    orders: Table,
) -> None:
    """The description kept per table schema is pyiceberg's, field for field; a file
    whose schema differs from one that passed is still refused."""
    first = as_table_uri(write_orders(orders, [1, 2, 3]), orders)
    ours = _describe(orders.io, orders.metadata, first)
    theirs = parquet_file_to_data_file(orders.io, orders.metadata, first)
    assert ours == theirs and ours.file_size_in_bytes == os.path.getsize(local(first))
    commit_files(orders, added=[first], lsn=Lsn("0/10"))
    again = as_table_uri(write_orders(orders, [4]), orders)  # the check kept: same answer
    assert _describe(orders.io, orders.metadata, again) == parquet_file_to_data_file(
        orders.io, orders.metadata, again
    )
    nullable = ORDERS_ARROW.set(0, pa.field("id", pa.int64(), nullable=True))
    bad = write_data_file(orders, to_arrow([order(5)], ORDERS_ARROW).cast(nullable))
    with pytest.raises(SinkError, match="does not match") as info:
        commit_files(orders, added=[bad], lsn=Lsn("0/20"))
    assert info.value.context["file"] == as_table_uri(bad, orders)
    assert ids(orders) == [1, 2, 3]
