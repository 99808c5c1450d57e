"""Manifest lists and manifests read with kept Avro readers: what pyiceberg reads, entry
for entry, for every kind of file a table holds, and a reader per file schema."""

from __future__ import annotations

import numpy as np
from pyiceberg.manifest import ManifestEntry, ManifestFile, read_manifest_list
from pyiceberg.table import Table

from sparkapply.apply.write.parquet import TableWriter
from sparkapply.datafiles import data_directory
from sparkapply.lsn import Lsn
from sparkapply.sink import commit_files, current_data_files, read_table
from sparkapply.sink.avro_reads import _READERS, manifest_entries, manifest_list
from tests.mirror import assert_readers_agree
from tests.readers import Readers

from .executor_files import ORDERS_ARROW, write_orders


def _fields(m: ManifestFile) -> tuple[object, ...]:
    return (
        m.manifest_path,
        m.manifest_length,
        m.content,
        m.sequence_number,
        m.min_sequence_number,
        m.added_snapshot_id,
        m.added_files_count,
        m.existing_files_count,
        m.deleted_files_count,
        m.added_rows_count,
        m.partitions,
    )


def _entry(e: ManifestEntry) -> tuple[object, ...]:
    f = e.data_file
    return (
        e.status,
        e.snapshot_id,
        e.sequence_number,
        e.file_sequence_number,
        f.content,
        f.file_path,
        f.file_format,
        f.record_count,
        f.file_size_in_bytes,
        f.value_counts,
        f.null_value_counts,
        f.lower_bounds,
        f.upper_bounds,
        f.spec_id,
    )


def test_reads_are_pyiceberg_reads(orders: Table) -> None:
    """Appends (pyiceberg's own manifests), a row delta (data and delete manifests) and
    a truncate (DELETED entries) read the same both ways, with and without the
    DELETED entries, in every snapshot."""
    commit_files(orders, added=[write_orders(orders, [1, 2])], lsn=Lsn(1))
    commit_files(orders, added=[write_orders(orders, [3])], lsn=Lsn(2))
    first = current_data_files(orders)[0].path
    deletes = TableWriter(data_directory(orders), ORDERS_ARROW).write_deletes(
        {first: np.array([1], np.int64)}
    )
    assert deletes is not None
    commit_files(orders, added=[write_orders(orders, [4])], deletes=[deletes], lsn=Lsn(3))
    commit_files(orders, added=[write_orders(orders, [5])], truncate=True, lsn=Lsn(4))

    kinds = set()
    for snapshot in orders.metadata.snapshots:
        ours = manifest_list(snapshot.manifest_list, orders.io)
        theirs = tuple(read_manifest_list(orders.io.new_input(snapshot.manifest_list)))
        assert [_fields(m) for m in ours] == [_fields(m) for m in theirs]
        for manifest in theirs:
            kinds.add(manifest.content)
            for discard in (True, False):
                got = manifest_entries(manifest, orders.io, discard_deleted=discard)
                want = manifest.fetch_manifest_entry(orders.io, discard_deleted=discard)
                assert [_entry(e) for e in got] == [_entry(e) for e in want]
    assert len(kinds) == 2  # data and delete manifests were both read
    rows = read_table(orders)
    assert sorted(rows.column("id").to_pylist()) == [5]
    with Readers() as readers:  # the manifests written with kept writers, read by all
        assert_readers_agree("public.orders", orders, rows, readers)
    built = len(_READERS._built)
    manifest_list(orders.metadata.snapshots[-1].manifest_list, orders.io)
    assert len(_READERS._built) == built  # the same schemas: no reader built again
