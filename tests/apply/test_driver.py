"""How a batch's table tasks are split into key-hash partitions and merged back."""

from __future__ import annotations

import dataclasses
import itertools

import pyarrow as pa

from sparkapply.apply.fold.rowwise import TxnInput
from sparkapply.apply.job import (
    STAGED_TASKS,
    merge_results,
    partitions_for,
    slices,
    spooled_bytes,
)
from sparkapply.apply.tasks import TableResult, TableTask
from sparkapply.changes.spool import SpoolSegment
from sparkapply.datafiles import DeleteFileInfo
from sparkapply.errors import ApplyError
from sparkapply.storage import Storage

MB = 1024 * 1024


_SPOOL_FILES = itertools.count()


def task(
    nbytes: int, *, keyed: bool = True, insert_only: bool = False, seg: SpoolSegment | None = None
) -> TableTask:
    """A task reading ``nbytes`` of a spool file of its own (or ``seg``)."""
    seg = seg or SpoolSegment(f"/spool/{next(_SPOOL_FILES)}", 0, nbytes)
    return TableTask(
        table="public.t",
        relation_ids=frozenset({1}),
        identity="key" if keyed else "none",
        key_names=("id",) if keyed else (),
        txns=(TxnInput(0, 1, 10, (seg,), ()),),
        schema=pa.schema([pa.field("id", pa.int64())]),
        data_files=(),
        delete_files=(),
        data_dir="/d",
        proto_version=4,
        streaming="parallel",
        insert_only=insert_only,
        storage=Storage(),
    )


def test_only_big_keyed_mutating_batches_are_split() -> None:
    assert partitions_for(task(1 * MB), 8, 16 * MB, 0) == 1
    assert partitions_for(task(40 * MB), 8, 16 * MB, 0) == 3
    assert partitions_for(task(400 * MB), 8, 16 * MB, 0) == 8  # the cluster's parallelism
    assert partitions_for(task(400 * MB), 8, 16 * MB, 2) == 2  # the configured cap
    assert partitions_for(task(400 * MB, keyed=False), 8, 16 * MB, 0) == 1
    assert partitions_for(task(400 * MB, insert_only=True), 8, 16 * MB, 0) == 1


def test_staged_pieces_are_composed_by_a_few_tasks() -> None:
    def staged(pieces: int) -> TableTask:
        files = tuple(((f"/d/p{i}.parquet",), f"/d/p{i}-keys.parquet") for i in range(pieces))
        return dataclasses.replace(task(1 * MB), staged=files)

    assert partitions_for(staged(1), 2, 16 * MB, 0) == 1  # one piece: one task
    assert partitions_for(staged(20), 2, 16 * MB, 0) == 2  # the cluster's parallelism
    assert partitions_for(staged(20), 64, 16 * MB, 0) == STAGED_TASKS  # each reads every key
    assert partitions_for(staged(20), 64, 16 * MB, 1) == 1  # the configured cap


def test_partition_results_merge_into_one_commit() -> None:
    d = DeleteFileInfo("/d/x-deletes.parquet", 2, 10, "/d/a", "/d/a", 0, 1)
    parts = [
        TableResult(
            "public.t",
            added=["/d/1"],
            rows_written=3,
            n_changes=9,
            partition=1,
            timings={"fold": 1.0, "write": 0.5},
        ),
        TableResult(
            "public.t",
            added=["/d/0"],
            deletes=[d],
            rows_written=2,
            rows_removed=2,
            n_changes=9,
            last_commit_lsn=7,
            partition=0,
            timings={"fold": 2.0},
        ),
        TableResult("public.u", added=["/d/u"], rows_written=1, n_changes=1),
    ]
    merged = {r.table: r for r in merge_results(parts)}
    t = merged["public.t"]
    assert t.added == ["/d/0", "/d/1"] and t.deletes == [d]
    assert (t.rows_written, t.rows_removed, t.n_changes, t.tasks) == (5, 2, 9, 2)
    assert t.last_commit_lsn == 7
    assert t.timings == {"fold": 3.0, "write": 0.5}  # task seconds, summed
    assert parts[1].timings == {"fold": 2.0}  # the partition's own result is not changed
    assert merged["public.u"].tasks == 1
    failed = merge_results([*parts[:2], dataclasses.replace(parts[0], error=ApplyError("x"))])
    assert failed[0].error is not None


def test_a_small_batch_of_many_tables_goes_in_one_wave() -> None:
    tasks = [dataclasses.replace(task(n * 1000), table=f"public.t{n}") for n in (5, 1, 4, 2, 3)]
    groups = slices(tasks, 2, 16 * MB)
    assert len(groups) == 2  # one partition per core, every task in one of them
    assert sorted(t.table for g in groups for t in g) == sorted(t.table for t in tasks)
    loads = sorted(sum(int(t.table[-1]) for t in g) for g in groups)
    assert loads == [7, 8]  # balanced by bytes: {5, 2, 1} and {4, 3}


def test_one_transaction_over_many_tables_is_a_small_batch() -> None:
    """300 tables' shares of one 1 MB transaction read the same bytes: 1 MB to read,
    not 300, so the batch goes in one wave of two partitions."""
    shared = SpoolSegment("/spool/one", 0, 1 * MB)
    tasks = [dataclasses.replace(task(0, seg=shared), table=f"public.t{n}") for n in range(300)]
    assert spooled_bytes(tasks) == 1 * MB
    assert sorted(len(g) for g in slices(tasks, 2, 16 * MB)) == [150, 150]


def test_a_big_or_narrow_batch_goes_one_task_per_partition() -> None:
    big = [task(10 * MB), task(10 * MB), task(1 * MB)]
    assert [len(g) for g in slices(big, 2, 16 * MB)] == [1, 1, 1]
    few = [task(2 * MB), task(1 * MB)]
    assert [g[0].txns[0].segments[0].nbytes for g in slices(few, 2, 16 * MB)] == [2 * MB, 1 * MB]
