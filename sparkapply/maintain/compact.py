"""Compaction as one Spark job per table; the driver commits one ``replace`` snapshot.

ORDER AND FAILURE

1. Plan against the table's current snapshot (``plan.py``).
2. One Spark job: a task per group of data files (rewrite without deleted rows) and
   one task merging the delete files that still apply. Each task removes what it wrote
   if it fails; then the driver removes every other task's files and raises.
3. Failpoint ``compact-before-commit``: files written, nothing committed. A crash here
   leaves unreferenced files, which the orphan sweep removes after its grace period;
   the table is unchanged.
4. Under ``guard`` (the table's lock, when the apply runs beside it), the table is read
   again and one catalog commit (``sink/rewrite.py``) lands on its current snapshot. If
   batches committed since the plan, their deletes of rewritten rows are carried over
   to the new files (``rebase.py``); if something else changed (a file to remove is
   gone), nothing lands: the new files are removed and the error
   (:class:`~sparkapply.errors.CommitConflictError`, transient) tells the caller to
   plan again later. The rows and the applied LSN are the same either way.

The lock keeps the commit from landing between an apply's planning and its commit (the
apply's row delta names row positions of the files compaction removes; the apply's
commit asserts its base snapshot, so it would be refused, not corrupted); the rewrite
itself runs while the apply goes on (``maintain/background.py``).

SMALL COMPACTIONS
    A Spark job costs most of a second on two cores however small its tasks, and a
    steady stream keeps small hot tables (pgbench's branches and tellers: a data file
    and a delete file a batch) compacting every few seconds: at 1,000 pgbench
    transactions a second, a third of the batches ran beside such a job and took
    twice as long (0.57 s against 0.28 s at the median). A plan whose tasks read at
    most ``driver_compact_bytes`` in all (``CompactionPlan.input_bytes``) runs them
    here, one after another, by the same code the executors run; a bigger one, or
    every one with ``driver_compact_bytes = 0``, is a Spark job.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from pyiceberg.table import Table
from pyspark.sql import SparkSession

from sparkapply.datafiles import DeleteFileInfo, arrow_schema_of, data_directory
from sparkapply.errors import CommitConflictError, SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.maintain.plan import CompactionPlan, plan_compaction
from sparkapply.maintain.rebase import carried_deletes
from sparkapply.maintain.tasks import MergeDeletesTask, RewriteTask, TaskResult, run_task
from sparkapply.sink.files import remove_orphans
from sparkapply.sink.rewrite import commit_rewrite
from sparkapply.sink.tables import table_name
from sparkapply.storage import Storage

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class CompactionOutcome:
    """What one compaction of a table did (its report and the maintenance log)."""

    data_files_rewritten: int = 0
    data_files_added: int = 0
    delete_files_removed: int = 0
    delete_files_added: int = 0
    bytes_rewritten: int = 0  # input data files
    bytes_written: int = 0
    rows: int = 0
    snapshot_id: int | None = None  # None: nothing committed (nothing to do, or dry run)


def compact(
    table: Table,
    spark: Callable[[], SparkSession],
    *,
    target_file_size: int,
    file_delete_ratio: float,
    driver_compact_bytes: int = 0,
    dry_run: bool = False,
    guard: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
) -> CompactionOutcome:
    """Compact ``table`` (see the module doc); ``spark`` is called only when there is
    work. ``dry_run``: plan and report, write nothing. ``guard()`` is held around the
    commit (the table's lock, when the apply runs beside it)."""
    plan = plan_compaction(
        table, target_file_size=target_file_size, file_delete_ratio=file_delete_ratio
    )
    outcome = CompactionOutcome()
    if plan is None:
        return outcome
    outcome.data_files_rewritten = len(plan.rewritten)
    outcome.delete_files_removed = len(plan.drop_deletes) + len(plan.merge_deletes)
    outcome.bytes_rewritten = sum(f.file_size_in_bytes for g in plan.groups for f in g)
    if dry_run:
        return outcome
    tasks = _tasks(table, plan, target_file_size)
    if plan.input_bytes <= driver_compact_bytes:
        results = [run_task(task) for task in tasks]
    else:
        results = _run_job(spark(), tasks)
    added = [p for r in results for p in r.added]
    merged = [r.deletes for r in results if r.deletes is not None]
    written = [*added, *(d.path for d in merged)]
    failed = [r for r in results if r.error is not None]
    if failed:
        remove_orphans(table, written)
        err = failed[0].error
        assert err is not None
        raise err
    failpoint("compact-before-commit")
    try:
        with guard():
            head, carried = _head(table, plan, results)
            if carried is not None:
                written.append(carried.path)
                merged.append(carried)
            committed = commit_rewrite(
                table,
                base_snapshot_id=head,
                added_data=added,
                added_deletes=merged,
                removed=plan.removed,
            )
    except SparkapplyError:
        remove_orphans(table, written)
        raise
    outcome.snapshot_id = committed.snapshot_id
    outcome.data_files_added = committed.data_files_added
    outcome.delete_files_added = committed.delete_files_added
    outcome.bytes_written = sum(r.bytes_out for r in results)
    outcome.rows = sum(r.rows_out for r in results if r.added)
    logger.info(
        "compacted %s: %d data files (%d bytes) into %d, %d delete files into %d, "
        "%d rows; snapshot %s",
        table_name(table),
        outcome.data_files_rewritten,
        outcome.bytes_rewritten,
        outcome.data_files_added,
        outcome.delete_files_removed,
        outcome.delete_files_added,
        outcome.rows,
        committed.snapshot_id,
    )
    return outcome


def _tasks(
    table: Table, plan: CompactionPlan, target_file_size: int
) -> list[RewriteTask | MergeDeletesTask]:
    name = table_name(table)
    schema = arrow_schema_of(table)
    data_dir = data_directory(table)
    storage = Storage.of(table.io.properties)
    tasks: list[RewriteTask | MergeDeletesTask] = [
        RewriteTask(
            name, group, plan.delete_files, schema, data_dir, target_file_size, storage=storage
        )
        for group in plan.groups
    ]
    if plan.merge_deletes:
        merge = plan.merge_deletes
        tasks.append(
            MergeDeletesTask(name, merge, plan.keep_paths, schema, data_dir, storage=storage)
        )
    return tasks


def _run_job(spark: SparkSession, tasks: list[RewriteTask | MergeDeletesTask]) -> list[TaskResult]:
    """One job, one partition per task."""
    if not tasks:
        return []
    rdd = spark.sparkContext.parallelize(tasks, len(tasks))
    results: list[TaskResult] = rdd.map(run_task).collect()
    return results


def _head(
    table: Table, plan: CompactionPlan, results: list[TaskResult]
) -> tuple[int, DeleteFileInfo | None]:
    """The snapshot to commit on (the table's current one, read again under the
    lock) and, if batches committed since the plan, the delete file that carries
    their deletes of rewritten rows over to the new files (``rebase.py``)."""
    try:
        table.refresh()
        head = table.metadata.current_snapshot_id
        if head is None or head == plan.base_snapshot_id:
            return plan.base_snapshot_id, None
        moved = {path: m for r in results for path, m in r.moved.items()}
        return head, carried_deletes(table, plan.delete_files, moved)
    except SparkapplyError:
        raise
    except Exception as exc:
        raise CommitConflictError(
            f"cannot carry the rewrite over to the table's new snapshot: "
            f"{type(exc).__name__}: {exc}",
            table=table_name(table),
            hint="nothing was committed; plan the rewrite again (retried at the next run)",
        ) from exc
