"""Run a batch's table tasks as one Spark job, from the driver.

A table whose batch is big is folded by several tasks, one per key-hash partition
(see ``plan/partition.py``, MANY TASKS PER TABLE); their files are merged back into one
result per table, which the driver commits as one snapshot (``run/batch.py``).

SMALL BATCHES
    A Spark job costs a tenth to a fifth of a second however small its tasks (the
    job's scheduling, each task's trip to a Python worker and back). A small batch
    with more tables than the cluster has cores goes as one partition per core, each
    folding several tables, so its trips come in one wave, not two (``slices``). With
    ``[apply] driver_fold_bytes`` set, a batch whose tasks read at most that much
    spool in all, and compose no staged pieces (``on_driver``), is folded here, in the
    driver's process, one task after another, by the same code the executors run; it
    writes a few small files, beside the manifests and metadata the driver writes
    anyway.

    On by default, up to 16 MiB of spool (``split_bytes``, where a table's batch is
    split over several tasks anyway), as measured in the product (bench/README.md,
    2026-11-27), in two pairs of runs back to back at 1,000 pgbench transactions a
    second: the staleness went from 0.69 / 1.46 / 2.17 s (p50 / p95 / max) to 0.54 /
    1.27 / 1.82 s, and from 0.71 / 1.28 / 1.92 s to 0.47 / 1.21 / 1.98 s. It was off
    before, when the receiving thread spent 12 µs a transaction and kept a batch that
    ended waiting up to 50 ms: folding in the driver's process shares its interpreter
    lock with that thread and with maintenance beside the apply, and then made the
    slowest batches slower (p95 1.53-1.59 s against 1.17 s at 1,000 tps). Bigger
    batches (a backlog of 20,000 pgbench transactions: its four tables' tasks read 40
    MB), and every batch on a cluster whose driver should write no data files
    (``driver_fold_bytes = 0``), are Spark jobs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pyspark.sql import SparkSession

from sparkapply.apply.fold import chunks
from sparkapply.apply.fold.rowwise import coalesced
from sparkapply.apply.tasks import TableResult, TableTask, run_table_task

STAGED_TASKS = 4


def task_bytes(task: TableTask) -> int:
    return sum(s.nbytes for x in task.txns for s in x.segments)


def partitions_for(task: TableTask, parallelism: int, split_bytes: int, cap: int) -> int:
    """How many tasks fold ``task``'s table: one, unless it is keyed, not insert-only
    and big; then one per ``split_bytes``, at most the cluster's parallelism (or
    ``cap``). Staged pieces are composed by up to :data:`STAGED_TASKS` tasks, by key
    (fold/staged.py, SEVERAL TASKS): each reads every piece's keys, so more would
    read more than they save."""
    if task.insert_only or not task.keyed or split_bytes <= 0:
        return 1
    limit = cap if cap > 0 else parallelism
    if task.staged:
        return max(1, min(limit, STAGED_TASKS, len(task.staged)))
    return max(1, min(limit, math.ceil(task_bytes(task) / split_bytes)))


def merge_results(results: Sequence[TableResult]) -> list[TableResult]:
    """One result per table from its partitions' results (partition 0 counts the
    changes: every partition decodes all of them)."""
    merged: dict[str, TableResult] = {}
    for r in sorted(results, key=lambda r: r.partition):
        into = merged.get(r.table)
        if into is None:
            merged[r.table] = dataclasses.replace(
                r, added=list(r.added), deletes=list(r.deletes), timings=dict(r.timings)
            )
            continue
        into.added += r.added
        into.deletes += r.deletes
        into.rows_written += r.rows_written
        into.rows_removed += r.rows_removed
        into.truncated = into.truncated or r.truncated
        into.unstaged = into.unstaged or r.unstaged
        into.last_commit_lsn = max(into.last_commit_lsn, r.last_commit_lsn)
        into.seconds = max(into.seconds, r.seconds)
        into.tasks += r.tasks
        for phase, seconds in r.timings.items():  # task seconds, summed over partitions
            into.timings[phase] = into.timings.get(phase, 0.0) + seconds
        if into.error is None:
            into.error = r.error
    return list(merged.values())


def on_driver(tasks: Sequence[TableTask], driver_fold_bytes: int) -> bool:
    """Whether the batch is folded here (see SMALL BATCHES): at most
    ``driver_fold_bytes`` of spool in all, and no staged pieces to compose, whose work
    is the pieces' keys, up to millions, not the spool left after them (a 1,000,000-row
    update composed here took 0.85-1.03 s, against 0.3-0.4 s in Spark's tasks)."""
    if driver_fold_bytes <= 0 or any(t.staged for t in tasks):
        return False
    return sum(task_bytes(t) for t in tasks) <= driver_fold_bytes


def _on_driver(task: TableTask) -> TableResult:
    result = run_table_task(dataclasses.replace(task, txns=tuple(coalesced(task.txns))))
    result.tasks = 0  # no Spark task
    return result


def run_tasks(
    spark: SparkSession,
    tasks: Sequence[TableTask],
    *,
    split_bytes: int = 16 * 1024 * 1024,
    max_tasks_per_table: int = 0,
    driver_fold_bytes: int = 0,
) -> list[TableResult]:
    """One job, one partition per (table, key partition) task, biggest first (they
    bound the job); or, for a small batch, each task here (see SMALL BATCHES)."""
    if not tasks:
        return []
    if on_driver(tasks, driver_fold_bytes):
        with chunks.shared():  # the tables' tasks read the same spool once
            return [_on_driver(t) for t in tasks]
    parallelism = spark.sparkContext.defaultParallelism
    expanded: list[TableTask] = []
    for task in tasks:
        # Back-to-back transactions travel as one input: one object to pickle and
        # unpickle instead of 20,000 (the executor splits a run again only to name
        # one transaction in an error). A run spans its members' bytes exactly.
        task = dataclasses.replace(task, txns=tuple(coalesced(task.txns)))
        n = partitions_for(task, parallelism, split_bytes, max_tasks_per_table)
        expanded += [dataclasses.replace(task, partition=(i, n)) for i in range(n)]
    groups = slices(expanded, parallelism, split_bytes)
    rdd = spark.sparkContext.parallelize(groups, len(groups))
    results: list[TableResult] = rdd.flatMap(run_group).collect()
    return merge_results(results)


def slices(tasks: Sequence[TableTask], parallelism: int, split_bytes: int) -> list[list[TableTask]]:
    """The job's partitions, biggest first (they bound the job): one per task; but a
    small batch (under ``split_bytes`` in all) with more tasks than the cluster runs
    at once is ``parallelism`` partitions of several tasks, balanced by bytes (see
    SMALL BATCHES: a second wave of task trips would cost more than its folds)."""
    share = {id(t): task_bytes(t) // t.partition[1] for t in tasks}  # one key partition's
    ordered = sorted(tasks, key=lambda t: -share[id(t)])
    if len(ordered) <= parallelism or spooled_bytes(tasks) > split_bytes:
        return [[t] for t in ordered]
    groups: list[list[TableTask]] = [[] for _ in range(parallelism)]
    loads = [0] * parallelism
    for t in ordered:
        i = loads.index(min(loads))
        groups[i].append(t)
        loads[i] += share[id(t)] + 1  # + 1: empty tasks still spread
    return groups


def spooled_bytes(tasks: Sequence[TableTask]) -> int:
    """The spool the tasks read, each range once: one transaction over 300 tables is
    300 tasks reading the same bytes, a small batch all the same (summed per task, it
    went as 300 partitions, and paid 300 trips to a Python worker: 9 s for 693 changes)."""
    ranges = {s for task in tasks for x in task.txns for s in x.segments}
    return sum(s.nbytes for s in ranges)


def run_group(tasks: list[TableTask]) -> list[TableResult]:
    """One partition's tasks, one after another (on an executor), reading the spool
    they share once."""
    with chunks.shared():
        return [run_table_task(t) for t in tasks]
