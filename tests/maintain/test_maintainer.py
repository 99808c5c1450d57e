"""The policy (what runs when), manifest merge, reports, and ``sparkapply maintain``,
on the real catalog and warehouse with a real local Spark."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sparkapply.cli import main
from sparkapply.config import MaintenanceConfig
from sparkapply.errors import SparkapplyError
from sparkapply.lsn import Lsn
from sparkapply.maintain import Maintainer
from sparkapply.maintain.plan import health
from sparkapply.sink import applied_lsn, commit_files, current_data_files
from tests.readers import read_with_duckdb
from tests.sink.conftest import ORDERS
from tests.sink.executor_files import write_orders

from .conftest import arrow_ids, churn, delete_positions, files, rows

QUIET = {
    "max_data_files": 1000,
    "max_delete_files": 1000,
    "max_delete_ratio": 1.0,
    "max_manifests": 1000,
    "retain_snapshots": 1000,
    "orphan_interval_seconds": 1e9,
}


def maintainer(catalog: Catalog, spark: Any, **cfg: Any) -> Maintainer:
    return Maintainer(MaintenanceConfig(**{**QUIET, **cfg}), spark, catalog)


def test_run_due_runs_what_the_thresholds_call_for(
    catalog: Catalog, orders: Table, spark: Any
) -> None:
    m = maintainer(
        catalog,
        spark,
        max_data_files=3,
        retain_snapshots=2,
        retain_seconds=0,
        orphan_grace_seconds=0,
    )
    churn(orders, 2)
    first = m.run_due([ORDERS])
    assert len(first) == 1 and first[0].orphans is not None  # the first call sweeps
    assert first[0].compaction is None and not first[0].committed

    churn(orders, 2, start_lsn=3)  # 4 data files > 3
    before_rows, lsn = rows(orders), applied_lsn(orders)
    changed: list[tuple[str, str]] = []
    (report,) = m.run_due([ORDERS], on_commit=changed.append)
    assert changed == [ORDERS]
    assert report.committed and report.compaction is not None
    assert report.compaction.data_files_rewritten == 4
    assert report.expiry is not None and report.expiry.snapshots_expired > 0
    assert report.orphans is None  # swept a moment ago
    assert report.before.data_files == 4 and report.after is not None
    assert report.after.data_files == 1 and report.after.delete_files == 0
    table = catalog.load_table(ORDERS)
    assert rows(table) == before_rows and applied_lsn(table) == lsn
    assert len(table.metadata.snapshots) == 2
    assert "compaction 4 data files -> 1" in report.summary()

    assert m.run_due([ORDERS], on_commit=changed.append) == []  # nothing due any more
    assert changed == [ORDERS]


def test_a_small_table_over_the_delete_ratio_waits_for_the_file_counts(
    catalog: Catalog, orders: Table, spark: Any
) -> None:
    """A hot small table is over any delete ratio after each batch; rewriting it then
    would run after every batch. Its file counts decide instead."""
    m = maintainer(catalog, spark, max_delete_ratio=0.01, max_delete_files=2)
    churn(orders, 3)  # 2 of 31 rows deleted: over the ratio, 2 delete files
    assert health(orders).delete_ratio > 0.01
    (first,) = m.run_due([ORDERS])
    assert first.compaction is None and not first.committed
    churn(orders, 2, start_lsn=4)  # a third delete file
    (second,) = m.run_due([ORDERS])
    assert second.committed and second.compaction is not None
    assert second.after is not None and second.after.delete_files == 0


def test_manifests_are_merged(catalog: Catalog, orders: Table, spark: Any) -> None:
    churn(orders, 6)
    assert health(orders).manifests > 6
    before_rows = rows(orders)
    files_before = (health(orders).data_files, health(orders).delete_files)
    (report,) = maintainer(catalog, spark, max_manifests=3).run_due([ORDERS])
    assert report.manifests_merged is not None
    assert report.manifests_merged[1] == 2  # one data manifest, one delete manifest
    table = catalog.load_table(ORDERS)
    assert health(table).manifests == 2
    assert (health(table).data_files, health(table).delete_files) == files_before
    assert rows(table) == before_rows
    assert arrow_ids(read_with_duckdb(table)) == [r[0] for r in before_rows]
    assert applied_lsn(table) == applied_lsn(orders)


def test_run_logs_what_it_did(
    catalog: Catalog, orders: Table, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    churn(orders, 3)
    with caplog.at_level(logging.INFO, logger="sparkapply.maintain"):
        report = maintainer(catalog, spark, retain_snapshots=1, retain_seconds=0).run(ORDERS)
    assert report.committed
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("maint"))
    for words in ("files 5->1", "bytes", "snapshots expired", "orphans removed", "s"):
        assert words in line


def write_config(tmp_path: Path, props: dict[str, str], **maintenance: object) -> Path:
    extra = "".join(f"{k} = {v}\n" for k, v in maintenance.items())
    path = tmp_path / "maintain.toml"
    path.write_text(
        '[source]\ndsn = "host=nowhere"\npublication = "pub"\n'
        f'[sink]\ncatalog_name = "test"\n[sink.catalog]\ntype = "sql"\nuri = "{props["uri"]}"\n'
        f'warehouse = "{props["warehouse"]}"\n'
        f'[spark]\nmaster = "local[1]"\n[maintenance]\n{extra}'
    )
    return path


def test_maintain_dry_run_changes_nothing(
    catalog: Catalog, catalog_properties: dict[str, str], orders: Table, tmp_path: Path
) -> None:
    churn(orders, 5)
    listing, location = files(orders), orders.metadata_location
    config = write_config(
        tmp_path, catalog_properties, retain_snapshots=1, retain_seconds=0, orphan_grace_seconds=0
    )
    (tmp_path / "warehouse" / "public" / "orders" / "data" / "stray.parquet").write_bytes(b"x")
    listing = files(orders)
    assert main(["maintain", "--config", str(config), "--dry-run"]) == 0
    assert main(["maintain", "--config", str(config), "--table", "public.orders", "--dry-run"]) == 0
    table = catalog.load_table(ORDERS)
    assert table.metadata_location == location
    assert files(table) == listing


@pytest.mark.usefixtures("spark")
def test_maintain_command(
    catalog: Catalog, catalog_properties: dict[str, str], orders: Table, tmp_path: Path
) -> None:
    churn(orders, 5)
    before_rows, lsn = rows(orders), applied_lsn(orders)
    stray = tmp_path / "warehouse" / "public" / "orders" / "data" / "stray.parquet"
    stray.write_bytes(b"x")
    config = write_config(
        tmp_path, catalog_properties, retain_snapshots=1, retain_seconds=0, orphan_grace_seconds=0
    )
    assert main(["maintain", "--config", str(config), "--table", "public.orders"]) == 0
    table = catalog.load_table(ORDERS)
    assert rows(table) == before_rows and applied_lsn(table) == lsn
    assert (health(table).data_files, health(table).delete_files) == (1, 0)
    assert len(table.metadata.snapshots) == 1
    assert not stray.exists()


def test_no_replanning_while_nothing_is_worth_rewriting(
    catalog: Catalog, orders: Table, spark: Any
) -> None:
    for i in range(1, 5):  # four files, none small for a 1-byte target, no deletes
        commit_files(orders, added=[write_orders(orders, [i])], lsn=Lsn(i))
    m = maintainer(catalog, spark, target_file_size=1, max_data_files=2)
    (report,) = m.run_due([ORDERS, ("public", "not_yet_created")])
    assert report.compaction is not None and report.compaction.snapshot_id is None
    assert m.run_due([ORDERS]) == []  # the same files: not planned again
    commit_files(orders, added=[write_orders(orders, [5])], lsn=Lsn(5))
    assert m.run_due([ORDERS]) == []  # one more file is not enough
    commit_files(orders, added=[write_orders(orders, [6])], lsn=Lsn(6))
    (report,) = m.run_due([ORDERS])
    assert report.compaction is not None


def test_a_failed_step_between_batches_is_logged_not_raised(
    catalog: Catalog, orders: Table, spark: Any
) -> None:
    churn(orders, 4)
    lost = current_data_files(orders)[0].path  # a data file lost from storage
    os.remove(lost.removeprefix("file://"))
    listing, location = files(orders), orders.metadata_location
    m = maintainer(catalog, spark, max_data_files=2)
    (report,) = m.run_due([ORDERS])
    assert report.errors and "compaction task failed" in report.errors[0]
    assert not report.committed
    table = catalog.load_table(ORDERS)
    assert table.metadata_location == location and files(table) == listing
    with pytest.raises(SparkapplyError, match="compaction task failed"):
        m.run(ORDERS)


def test_a_table_the_apply_always_beats_is_held_through_its_maintenance(
    catalog: Catalog, orders: Table, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside the apply, a compaction carries over what batches committed meanwhile,
    but not a TRUNCATE (the files it rewrote are gone). On a table where such a batch
    commits before every compaction can, it loses; after two runs that lost a race,
    the next run holds the table's lock from plan to commit, so it lands (the batch
    waits for it) and the files stop growing."""
    import threading

    import sparkapply.maintain.compact as compact_module
    from sparkapply.sink.locks import TableLocks

    locks = TableLocks()
    m = maintainer(catalog, spark, max_data_files=3)
    m.locks = locks
    churn(orders, 4)
    lsn = iter(range(100, 200))
    batches: list[threading.Thread] = []

    def batch() -> None:
        with locks.hold([ORDERS]):  # as the apply does, from plan to commit
            table = catalog.load_table(ORDERS)
            n = next(lsn)
            # Four files, so that the table is over its file count again.
            added = [write_orders(table, [n * 10 + k]) for k in range(4)]
            commit_files(table, added=added, truncate=True, lsn=Lsn(n))

    def a_batch_commits_first(name: str) -> None:  # just before the compaction commits
        thread = threading.Thread(target=batch)
        thread.start()
        batches.append(thread)
        if not m.holds(ORDERS, m.clock()):
            thread.join()  # unlocked maintenance: the batch gets in first
        # else the maintainer holds the table: the batch waits for its commit

    monkeypatch.setattr(compact_module, "failpoint", a_batch_commits_first)
    lost = [m.run_due([ORDERS])[0] for _ in range(2)]
    held = m.run_due([ORDERS])[0]
    for thread in batches:
        thread.join()
    assert all(r.lost_race and r.compaction is None for r in lost)
    assert held.compaction is not None and held.compaction.snapshot_id is not None
    assert not held.lost_race
    assert applied_lsn(catalog.load_table(ORDERS)) == Lsn(102)  # every batch landed
    # Still hot: the next run holds at once, with no race lost (no work thrown away).
    churn(catalog.load_table(ORDERS), 4, start_lsn=110)
    lsn = iter(range(120, 200))  # the next batch's LSN follows the churn's
    again = m.run_due([ORDERS])[0]
    for thread in batches:
        thread.join()
    assert again.compaction is not None and again.compaction.snapshot_id is not None
    assert not again.lost_race
    assert len(batches) == 4 and applied_lsn(catalog.load_table(ORDERS)) == Lsn(120)


def test_batches_that_commit_during_a_compaction_do_not_make_it_hold(
    catalog: Catalog, orders: Table, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that commits between a compaction's plan and its commit is carried
    over: the run commits, loses no race, and the next run does not hold the table
    (the apply never waits for a rewrite)."""
    import sparkapply.maintain.compact as compact_module
    from sparkapply.sink.locks import TableLocks

    m = maintainer(catalog, spark, max_data_files=3)
    locks = m.locks = TableLocks()
    where = churn(orders, 4)
    lsn = iter(range(100, 200))

    def a_batch_commits_first(name: str) -> None:
        with locks.hold([ORDERS]):
            table = catalog.load_table(ORDERS)
            n = next(lsn)
            path, pos = where[n - 99]  # ids 1, 2, ...: rows of files being rewritten
            commit_files(
                table,
                added=[write_orders(table, [n])],
                deletes=delete_positions(table, {path: [pos]}),
                lsn=Lsn(n),
            )

    monkeypatch.setattr(compact_module, "failpoint", a_batch_commits_first)
    before = {r[0] for r in rows(orders)}
    report = m.run_due([ORDERS])[0]
    assert report.compaction is not None and report.compaction.snapshot_id is not None
    assert not report.lost_race and not m.holds(ORDERS, m.clock())
    table = catalog.load_table(ORDERS)
    assert applied_lsn(table) == Lsn(100)
    assert {r[0] for r in rows(table)} == (before - {1}) | {100}
    monkeypatch.setattr(compact_module, "failpoint", lambda name: None)
    churn(table, 4, start_lsn=110)
    again = m.run_due([ORDERS])[0]
    assert again.compaction is not None and not again.lost_race
