"""Compaction on the real catalog and warehouse, with a real local Spark: rows, applied
LSN and schema unchanged; one replace snapshot; delete files folded; conflicts refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.types import LongType, StringType

from sparkapply.datafiles import arrow_schema_of
from sparkapply.lsn import Lsn
from sparkapply.maintain.compact import compact
from sparkapply.maintain.plan import health, plan_compaction
from sparkapply.sink import (
    CommitConflictError,
    applied_lsn,
    apply_evolution,
    commit_files,
    current_data_files,
    current_snapshot_id,
)
from sparkapply.sink.progress import LSN_SUMMARY_KEY
from tests.readers import read_with_duckdb, read_with_iceberg_rust
from tests.sink.conftest import ORDERS
from tests.sink.executor_files import order, to_arrow, write_data_file, write_orders

from .conftest import arrow_ids, churn, delete_positions, files, rows

MiB = 1024 * 1024


def run_compact(table: Table, spark: Any, **kw: Any) -> Any:
    kw.setdefault("target_file_size", 128 * MiB)
    kw.setdefault("file_delete_ratio", 0.2)
    return compact(table, lambda: spark, **kw)


@pytest.mark.parametrize("on_driver", [False, True], ids=["spark-job", "driver"])
def test_compaction_keeps_rows_lsn_and_schema(
    catalog: Catalog, orders: Table, spark: Any, on_driver: bool
) -> None:
    """The same either way: as a Spark job, or run here for a small plan (the session
    is then never asked for)."""
    churn(orders, 8)
    before_rows, before_lsn = rows(orders), applied_lsn(orders)
    before_schema = orders.schema()
    before = health(orders)
    assert (before.data_files, before.delete_files) == (8, 7)
    parent = current_snapshot_id(orders)
    plan = plan_compaction(orders, target_file_size=128 * MiB, file_delete_ratio=0.2)
    assert plan is not None and plan.input_bytes == before.data_bytes  # every file is read
    asked: list[bool] = []

    def session() -> Any:
        asked.append(True)
        return spark

    outcome = compact(
        orders,
        session,
        target_file_size=128 * MiB,
        file_delete_ratio=0.2,
        driver_compact_bytes=plan.input_bytes if on_driver else plan.input_bytes - 1,
    )
    assert asked == ([] if on_driver else [True])

    table = catalog.load_table(ORDERS)
    assert rows(table) == before_rows
    assert arrow_ids(read_with_duckdb(table)) == [r[0] for r in before_rows]
    assert applied_lsn(table) == before_lsn
    assert table.schema() == before_schema
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.parent_snapshot_id == parent  # exactly one new snapshot
    assert snapshot.summary.operation.value == "replace"
    assert snapshot.summary.additional_properties[LSN_SUMMARY_KEY] == str(before_lsn)
    after = health(table)
    assert (after.data_files, after.delete_files) == (1, 0)
    assert after.records == len(before_rows) and after.position_deletes == 0
    assert outcome.data_files_rewritten == 8 and outcome.delete_files_removed == 7
    # One data manifest with live files (the delete manifest records the removals only).
    live = [
        m for m in snapshot.manifests(table.io) if m.has_added_files() or m.has_existing_files()
    ]
    assert len(live) == 1
    # The apply goes on after it: the next commit plans against the compacted files.
    assert before_lsn is not None
    commit_files(table, added=[write_orders(table, [10_000])], lsn=Lsn(before_lsn + 1))
    assert len(rows(table)) == len(before_rows) + 1


def test_delete_files_of_big_files_are_merged(catalog: Catalog, orders: Table, spark: Any) -> None:
    big = write_orders(orders, list(range(1, 101)))
    commit_files(orders, added=[big], lsn=Lsn(1))
    big = current_data_files(orders)[0].path
    for i, lsn in ((0, 2), (1, 3), (2, 4)):
        commit_files(orders, added=[], deletes=delete_positions(orders, {big: [i]}), lsn=Lsn(lsn))
    before = rows(orders)
    # The file is "big" for a 1-byte target and 3 % deleted: not rewritten; the three
    # delete files still apply and become one.
    outcome = run_compact(orders, spark, target_file_size=1, file_delete_ratio=0.5)
    table = catalog.load_table(ORDERS)
    assert rows(table) == before and len(before) == 97
    assert arrow_ids(read_with_duckdb(table)) == [r[0] for r in before]
    assert (health(table).data_files, health(table).delete_files) == (1, 1)
    assert health(table).position_deletes == 3
    assert outcome.data_files_rewritten == 0 and outcome.delete_files_added == 1
    assert applied_lsn(table) == Lsn(4)
    # Now a file with half its rows deleted is rewritten and the delete file dropped.
    outcome = run_compact(table, spark, target_file_size=1, file_delete_ratio=0.03)
    table = catalog.load_table(ORDERS)
    assert rows(table) == before
    assert (health(table).data_files, health(table).delete_files) == (1, 0)


def test_nothing_to_do_commits_nothing(orders: Table, spark: Any) -> None:
    commit_files(orders, added=[write_orders(orders, [1, 2])], lsn=Lsn(1))
    snapshot = current_snapshot_id(orders)
    assert plan_compaction(orders, target_file_size=128 * MiB, file_delete_ratio=0.2) is None
    assert run_compact(orders, spark).snapshot_id is None
    assert current_snapshot_id(orders) == snapshot


def test_dry_run_writes_nothing(orders: Table, spark: Any) -> None:
    churn(orders, 4)
    listing, snapshot = files(orders), current_snapshot_id(orders)
    outcome = run_compact(orders, spark, dry_run=True)
    assert outcome.data_files_rewritten == 4 and outcome.snapshot_id is None
    assert files(orders) == listing and current_snapshot_id(orders) == snapshot


def test_apply_commits_during_compaction_are_carried_over(
    catalog: Catalog, orders: Table, spark: Any
) -> None:
    """Batches that commit while the rewrite runs, deleting rows of files it rewrites
    (one of them with a row already deleted at the plan, so positions shift), do not
    stop it: it lands on the newest snapshot and their deletes apply to the new files."""
    where = churn(orders, 5)  # ids 1-50; ids 1, 11, 21, 31 updated (old rows deleted)
    expected = {r[0]: r for r in rows(orders)}
    apply_table = catalog.load_table(ORDERS)
    plan_snapshot = current_snapshot_id(orders)
    planned = {f.path for f in current_data_files(orders)}

    def spark_after_two_batches() -> Any:
        # After the plan, before the commit: an update of id 12 (in batch 1's file, where
        # id 11's old version, the row before it, was deleted at the plan), then a delete
        # of ids 2 and 45 and an update of id 12 again.
        lsn = 100
        for ids in ([12], [2, 45, 12]):
            deleted = [where[i] for i in ids]
            by_file: dict[str, Sequence[int]] = {}
            for path, pos in deleted:
                by_file[path] = [*by_file.get(path, []), pos]
            added = write_orders(apply_table, [12], note=f"updated at {lsn}")
            commit_files(
                apply_table,
                added=[added],
                deletes=delete_positions(apply_table, by_file),
                lsn=Lsn(lsn),
            )
            where[12] = (added if "://" in added else f"file://{added}", 0)
            lsn += 1
        return spark

    outcome = compact(
        orders, spark_after_two_batches, target_file_size=128 * MiB, file_delete_ratio=0.2
    )
    assert outcome.snapshot_id is not None
    table = catalog.load_table(ORDERS)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    assert snapshot.parent_snapshot_id != plan_snapshot  # on the batches' snapshot
    assert applied_lsn(table) == Lsn(101)
    del expected[2], expected[45]
    got = {r[0]: r for r in rows(table)}
    assert got.pop(12)[6] == "updated at 101"
    del expected[12]
    assert got == expected
    ids = sorted(int(str(i)) for i in [*expected, 12])
    assert arrow_ids(read_with_duckdb(table)) == ids
    assert arrow_ids(read_with_iceberg_rust(table)) == ids
    assert planned.isdisjoint(f.path for f in current_data_files(table))  # all rewritten


def test_a_truncate_during_compaction_wins(catalog: Catalog, orders: Table, spark: Any) -> None:
    """What cannot be carried over (the files the plan rewrites are gone) is refused:
    nothing of the compaction lands and its files are removed."""
    churn(orders, 5)
    apply_table = catalog.load_table(ORDERS)
    listing: set[str] = set()

    def spark_after_a_truncate() -> Any:
        new = write_orders(apply_table, [7], note="after the truncate")
        commit_files(apply_table, added=[new], truncate=True, lsn=Lsn(100))
        listing.update(files(apply_table))
        return spark

    with pytest.raises(CommitConflictError):
        compact(orders, spark_after_a_truncate, target_file_size=128 * MiB, file_delete_ratio=0.2)
    table = catalog.load_table(ORDERS)
    assert applied_lsn(table) == Lsn(100)
    assert [(r[0], r[6]) for r in rows(table)] == [(7, "after the truncate")]
    assert files(table) == listing  # the compaction's files were removed


def test_a_compaction_refuses_an_apply_planned_before_it(
    catalog: Catalog, orders: Table, spark: Any
) -> None:
    where = churn(orders, 4)
    apply_table = catalog.load_table(ORDERS)
    planned = current_snapshot_id(apply_table)
    run_compact(orders, spark)
    path, pos = where[1]
    with pytest.raises(CommitConflictError):
        commit_files(
            apply_table,
            added=[write_orders(apply_table, [1], note="stale plan")],
            deletes=delete_positions(apply_table, {path: [pos]}),
            lsn=Lsn(100),
            base_snapshot_id=planned,
        )
    assert applied_lsn(catalog.load_table(ORDERS)) == Lsn(4)


def test_compaction_across_a_schema_change(catalog: Catalog, orders: Table, spark: Any) -> None:
    """Files written before a column was added and a type widened are rewritten in the
    current schema: the new column null, the widened column cast."""
    churn(orders, 3)
    assert apply_evolution(
        orders, add_columns=[("status", StringType())], widen=[("qty", LongType())]
    )
    schema = arrow_schema_of(orders)
    newer = to_arrow([{**order(10_000), "status": "paid"}], schema)
    commit_files(orders, added=[write_data_file(orders, newer)], lsn=Lsn(10))
    before = rows(orders)
    assert before[-1][-1] == "paid" and before[0][-1] is None
    run_compact(orders, spark)
    table = catalog.load_table(ORDERS)
    assert rows(table) == before
    assert health(table).data_files == 1
    assert arrow_ids(read_with_duckdb(table)) == [r[0] for r in before]


def test_a_big_file_is_not_rewritten_to_absorb_small_ones(orders: Table, spark: Any) -> None:
    big = write_orders(orders, list(range(1, 2001)))
    commit_files(orders, added=[big], lsn=Lsn(1))
    for i in range(3):
        commit_files(orders, added=[write_orders(orders, [5000 + i])], lsn=Lsn(2 + i))
    plan = plan_compaction(orders, target_file_size=128 * MiB, file_delete_ratio=0.2)
    assert plan is not None
    assert len(plan.groups) == 1 and len(plan.groups[0]) == 3
    largest = max(current_data_files(orders), key=lambda f: f.record_count)
    assert largest.record_count == 2000 and largest.path not in plan.rewritten
    before = rows(orders)
    run_compact(orders, spark)
    assert rows(orders) == before
    assert health(orders).data_files == 2  # the big file, and the small ones merged
