"""Expiry reads each manifest list and manifest once per process, and a snapshot's
removal is one commit that leaves the kept ones and the table's rows as they were."""

from __future__ import annotations

import datetime as dt

import numpy as np
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import ManifestFile, read_manifest_list
from pyiceberg.table import Table

from sparkapply.apply.write.parquet import TableWriter
from sparkapply.datafiles import data_directory
from sparkapply.lsn import Lsn
from sparkapply.sink import applied_lsn, commit_files, current_data_files, read_table
from sparkapply.sink.maintenance import expire_and_delete, referenced_files
from sparkapply.sink.manifest_reads import READS, ManifestReads
from tests.mirror import assert_readers_agree
from tests.readers import Readers

from .conftest import ORDERS
from .executor_files import ORDERS_ARROW, write_orders

NOW = dt.datetime.now(dt.UTC) + dt.timedelta(days=365)


def _commits(orders: Table, first: int, n: int) -> None:
    for i in range(first, first + n):
        commit_files(orders, added=[write_orders(orders, [i])], lsn=Lsn(i))


def test_a_second_expiry_reads_only_what_is_new(catalog: Catalog, orders: Table) -> None:
    _commits(orders, 1, 8)
    first = expire_and_delete(orders, older_than=NOW, retain_last=4)
    assert first.snapshots_expired == 4 and first.files_deleted > 0
    _commits(orders, 9, 3)
    before = READS.reads
    second = expire_and_delete(orders, older_than=NOW, retain_last=4)
    assert second.snapshots_expired == 3
    # The three new snapshots' manifest lists and the manifests they added; the
    # four kept last time were read then.
    new_lists = 3
    new_manifests = 3
    assert READS.reads - before == new_lists + new_manifests
    reloaded = catalog.load_table(ORDERS)
    assert len(reloaded.metadata.snapshots) == 4
    assert applied_lsn(reloaded) == Lsn(11)
    assert sorted(read_table(reloaded).column("id").to_pylist()) == list(range(1, 12))
    # What the sweep keeps is what a fresh read of the metadata names.
    assert referenced_files(reloaded) == referenced_files(catalog.load_table(ORDERS))


def test_the_reads_are_bounded(orders: Table) -> None:
    _commits(orders, 1, 5)
    reads = ManifestReads(max_lists=2, max_entries=8)
    for snapshot in orders.metadata.snapshots:
        for manifest in reads.manifests(snapshot, orders.io):
            reads.entries(manifest, orders.io)
    assert len(reads._lists) == 2
    assert reads._entries.count <= 8
    done = reads.reads
    newest = orders.metadata.snapshots[-1]
    reads.manifests(newest, orders.io)  # kept: not read again
    assert reads.reads == done
    reads.manifests(orders.metadata.snapshots[0], orders.io)  # evicted: read again
    assert reads.reads == done + 1


def test_live_entries_are_parsed_once_and_bounded(orders: Table) -> None:
    """The listings and a rewrite's commit take a manifest's live entries from one
    read; what is kept equals a fresh read, and stays within its bound."""
    _commits(orders, 1, 6)
    snapshot = orders.current_snapshot()
    assert snapshot is not None
    reads = ManifestReads(max_live_entries=8)
    manifests = reads.manifests(snapshot, orders.io)
    first = [reads.live_entries(m, orders.io) for m in manifests]
    done = reads.reads
    again = [reads.live_entries(m, orders.io) for m in manifests]
    assert reads.reads == done
    assert all(a is b for a, b in zip(first, again, strict=True))
    fresh = [m.fetch_manifest_entry(orders.io, discard_deleted=True) for m in manifests]
    assert [[e.data_file.file_path for e in x] for x in first] == [
        [e.data_file.file_path for e in x] for x in fresh
    ]
    assert reads._live.count <= 8


def test_a_list_this_process_wrote_is_kept_as_a_read_would_return_it(
    catalog: Catalog, orders: Table
) -> None:
    """Row deltas (the producer's snapshots) keep the lists they write; what is kept is
    field for field what reading the list back returns, sequence numbers included."""
    first = write_orders(orders, [1, 2, 3])
    commit_files(orders, added=[first], lsn=Lsn(1))
    data = current_data_files(orders)[0].path
    for lsn, pos in ((2, 0), (3, 1)):
        deletes = TableWriter(data_directory(orders), ORDERS_ARROW).write_deletes(
            {data: np.array([pos], np.int64)}
        )
        assert deletes is not None
        commit_files(
            orders, added=[write_orders(orders, [10 + lsn])], deletes=[deletes], lsn=Lsn(lsn)
        )
        snapshot = orders.current_snapshot()
        assert snapshot is not None
        before = READS.reads
        kept = READS.manifests(snapshot, orders.io)
        assert READS.reads == before  # not read: kept when written
        read = tuple(read_manifest_list(orders.io.new_input(snapshot.manifest_list)))
        assert [_fields(m) for m in kept] == [_fields(m) for m in read]
        assert {m.sequence_number for m in kept} >= {snapshot.sequence_number}
    fresh = catalog.load_table(ORDERS)
    rows = read_table(fresh)
    assert sorted(rows.column("id").to_pylist()) == [3, 12, 13]
    with Readers() as readers:
        assert_readers_agree("public.orders", fresh, rows, readers)


def _fields(manifest: ManifestFile) -> dict[str, object]:
    return {
        name: getattr(manifest, name)
        for name in (
            "manifest_path",
            "manifest_length",
            "partition_spec_id",
            "content",
            "sequence_number",
            "min_sequence_number",
            "added_snapshot_id",
            "added_files_count",
            "existing_files_count",
            "deleted_files_count",
            "added_rows_count",
            "existing_rows_count",
            "deleted_rows_count",
        )
    }
