"""Expiry that frees storage and the orphan sweep, on the real catalog and warehouse:
they delete exactly the files nothing retained references, never one a retained
snapshot (a reader holding an older snapshot) needs."""

from __future__ import annotations

import datetime as dt
import os
import time

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sparkapply.datafiles import data_directory
from sparkapply.lsn import Lsn
from sparkapply.sink import applied_lsn, commit_files
from sparkapply.sink.maintenance import (
    expire_and_delete,
    referenced_files,
    sweep_orphans,
)
from tests.sink.conftest import ORDERS
from tests.sink.executor_files import write_orders

from .conftest import churn, files, rows

UTC = dt.UTC
FUTURE = dt.datetime.now(UTC) + dt.timedelta(days=365)


def local(path: str) -> str:
    return path.removeprefix("file://")


def retained_files(table: Table) -> set[str]:
    """What reading any retained snapshot opens, listed independently of the module:
    manifest lists, manifests, and the data and delete files of each snapshot's scan."""
    needed = set()
    for snapshot in table.metadata.snapshots:
        needed.add(local(snapshot.manifest_list))
        for manifest in snapshot.manifests(table.io):
            needed.add(local(manifest.manifest_path))
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            needed.add(local(task.file.file_path))
            needed.update(local(d.file_path) for d in task.delete_files)
    return needed


def test_expiry_deletes_what_only_expired_snapshots_referenced(
    catalog: Catalog, orders: Table
) -> None:
    churn(orders, 10)
    current = rows(orders)
    old = orders.metadata.snapshots[-3]  # a reader holds this one: among the 3 newest
    old_rows = rows(orders, old.snapshot_id)
    before = {local(p) for p in files(orders)}

    outcome = expire_and_delete(orders, older_than=FUTURE, retain_last=3)

    table = catalog.load_table(ORDERS)
    assert outcome.snapshots_expired == 7 and len(table.metadata.snapshots) == 3
    after = {local(p) for p in files(table)}
    deleted = before - after
    assert deleted == {local(p) for p in outcome.deleted}
    assert outcome.files_deleted > 0
    # Nothing a retained snapshot reads was deleted, and the reader still reads.
    assert retained_files(table) <= after
    assert rows(table, old.snapshot_id) == old_rows
    assert rows(table) == current
    assert applied_lsn(table) == Lsn(10)
    # Every data, delete and manifest file left is one a retained snapshot uses:
    # expiry left no unreachable data behind (metadata JSON of the log aside).
    leftovers = {p for p in after if not p.endswith(".metadata.json")} - retained_files(table)
    assert leftovers == set()


def test_expiry_keeps_snapshots_younger_than_the_age_limit(orders: Table) -> None:
    churn(orders, 4)
    held = orders.metadata.snapshots[0]  # the oldest, but younger than the cutoff
    held_rows = rows(orders, held.snapshot_id)
    cutoff = dt.datetime.fromtimestamp(held.timestamp_ms / 1000, UTC)
    outcome = expire_and_delete(orders, older_than=cutoff, retain_last=1)
    assert outcome.snapshots_expired == 0 and outcome.files_deleted == 0
    assert rows(orders, held.snapshot_id) == held_rows


def test_expiry_dry_run_changes_nothing(orders: Table) -> None:
    churn(orders, 5)
    listing, location = files(orders), orders.metadata_location
    outcome = expire_and_delete(orders, older_than=FUTURE, retain_last=1, dry_run=True)
    assert outcome.snapshots_expired == 4 and outcome.files_deleted > 0
    assert files(orders) == listing and orders.metadata_location == location
    assert len(orders.metadata.snapshots) == 5


def test_orphan_sweep_deletes_exactly_unreferenced_old_files(
    catalog: Catalog, orders: Table
) -> None:
    churn(orders, 4)
    current = rows(orders)
    # Leftovers of crashed writes: a data file, a delete file, a manifest.
    data_dir = local(data_directory(orders))
    stray_data = local(write_orders(orders, [999]))
    stray_manifest = f"{local(orders.location())}/metadata/crashed-m0.avro"
    with open(stray_manifest, "wb") as f:
        f.write(b"Obj\x01")
    keep_me = f"{data_dir}/README.txt"  # not an Iceberg file name: never deleted
    with open(keep_me, "w") as f:
        f.write("mine")
    strays = {stray_data, stray_manifest}
    referenced = {local(p) for p in referenced_files(orders)}
    assert not strays & referenced

    young = sweep_orphans(orders, older_than=dt.datetime.now(UTC) - dt.timedelta(hours=24))
    assert young.files_deleted == 0 and young.too_young >= 2
    assert strays <= {local(p) for p in files(orders)}

    dry = sweep_orphans(orders, older_than=FUTURE, dry_run=True)
    assert {local(p) for p in dry.deleted} >= strays
    assert strays <= {local(p) for p in files(orders)}

    before = {local(p) for p in files(orders)}
    swept = sweep_orphans(orders, older_than=FUTURE)
    after = {local(p) for p in files(orders)}
    assert before - after == {local(p) for p in swept.deleted}
    assert strays <= before - after
    assert keep_me in after
    # Only unreferenced files went: every metadata file of the log, every file of
    # every snapshot stays, and the table reads the same.
    table = catalog.load_table(ORDERS)
    assert {local(p) for p in referenced_files(table)} <= after
    assert local(table.metadata_location) in after
    assert all(local(e.metadata_file) in after for e in table.metadata.metadata_log)
    assert rows(table) == current


def test_old_metadata_files_beyond_the_log_are_deleted(catalog: Catalog, orders: Table) -> None:
    txn = orders.transaction()
    txn.set_properties({"write.metadata.previous-versions-max": "2"})
    txn.commit_transaction()
    churn(orders, 6)  # row deltas: committed without pyiceberg's pruning of old metadata
    metadata_files = {p for p in files(orders) if p.endswith(".metadata.json")}
    logged = {local(e.metadata_file) for e in orders.metadata.metadata_log}
    assert len(logged) == 2 and len(metadata_files) > 3
    outcome = expire_and_delete(orders, older_than=FUTURE, retain_last=100)
    left = {local(p) for p in files(orders) if p.endswith(".metadata.json")}
    assert left == logged | {local(orders.metadata_location)}
    assert outcome.metadata_files_deleted == len(metadata_files) - len(left)


def test_metadata_files_go_by_the_tables_properties(catalog: Catalog, orders: Table) -> None:
    """sparkapply's tables keep the newest 20 (sink/tables.py); a table that turns
    delete-after-commit off keeps every one for the orphan sweep."""
    assert orders.properties["write.metadata.previous-versions-max"] == "20"
    assert orders.properties["write.metadata.delete-after-commit.enabled"] == "true"
    churn(orders, 24)
    snapshots = {s.snapshot_id: rows(orders, s.snapshot_id) for s in orders.metadata.snapshots}
    outcome = expire_and_delete(orders, older_than=FUTURE, retain_last=100)
    left = {p for p in files(orders) if p.endswith(".metadata.json")}
    assert len(left) == 21 and outcome.metadata_files_deleted > 0  # the log and the current
    reread = catalog.load_table(ORDERS)
    assert {s.snapshot_id: rows(reread, s.snapshot_id) for s in reread.metadata.snapshots} == (
        snapshots
    )  # every snapshot reads as before: none needs an old metadata file

    txn = orders.transaction()
    txn.set_properties({"write.metadata.delete-after-commit.enabled": "false"})
    txn.commit_transaction()
    churn(orders, 22, start_lsn=25)
    before = {p for p in files(orders) if p.endswith(".metadata.json")}
    outcome = expire_and_delete(orders, older_than=FUTURE, retain_last=100)
    assert outcome.metadata_files_deleted == 0
    assert {p for p in files(orders) if p.endswith(".metadata.json")} == before
    assert len(orders.metadata.metadata_log) == 20  # the log is trimmed all the same


def test_sweep_refuses_a_naive_cutoff(orders: Table) -> None:
    with pytest.raises(ValueError, match="timezone"):
        sweep_orphans(orders, older_than=dt.datetime(2000, 1, 1))


def test_a_file_older_than_the_grace_period_is_an_orphan(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn(1))
    stray = local(write_orders(orders, [2]))
    day_ago = time.time() - 2 * 86400
    os.utime(stray, (day_ago, day_ago))
    swept = sweep_orphans(orders, older_than=dt.datetime.now(UTC) - dt.timedelta(hours=24))
    assert [local(p) for p in swept.deleted] == [stray]
