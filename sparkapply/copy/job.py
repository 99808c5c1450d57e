"""The copy's Spark job: the slice tasks of the tables being copied, run as one job.

A table is cut into slices of heap blocks (:func:`~sparkapply.copy.snapshot.plan_slices`);
each slice is one task that joins the exported snapshot and streams its rows with
COPY into data files (:mod:`sparkapply.copy.tasks`). The driver commits what the job
returns (:mod:`sparkapply.copy.driver`); nothing here commits.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkapply.copy.snapshot import SourceTable, copy_query, plan_slices
from sparkapply.copy.tasks import SliceResult, SliceTask, run_slice
from sparkapply.datafiles import arrow_schema_of, data_directory
from sparkapply.errors import CopyError
from sparkapply.source.connection import session_conninfo
from sparkapply.storage import Storage

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PlannedTable:
    """A table about to be copied: its Iceberg table, and the snapshot the commit
    replaces (``base_snapshot``); ``slices`` is set when its tasks are made."""

    source: SourceTable
    ident: tuple[str, str]
    table: Any  # pyiceberg Table
    base_snapshot: int | None
    slices: int = 0


@dataclass(frozen=True, slots=True)
class SliceJob:
    """Makes the slice tasks of planned tables and runs them in one Spark job."""

    spark: Any
    dsn: str  # the publisher; each task connects with its own tag
    slice_bytes: int

    def tasks(self, planned: Sequence[PlannedTable], snapshot: str, prefix: str) -> list[SliceTask]:
        """The tasks of every planned table, biggest first; a task's tag is ``prefix``
        and a number (the progress finds its COPY by it)."""
        parallelism = int(getattr(self.spark.sparkContext, "defaultParallelism", 2) or 2)
        tasks: list[SliceTask] = []
        n = itertools.count()
        for p in planned:
            slices = plan_slices(p.source, slice_bytes=self.slice_bytes, parallelism=parallelism)
            if slices and not p.source.relation.columns:
                log.warning(
                    "table %s publishes no columns; its Iceberg table stays empty",
                    p.source.qualified,
                )
                slices = []
            p.slices = len(slices)
            if not slices:
                continue
            schema = arrow_schema_of(p.table)
            data_dir = data_directory(p.table)
            per_slice = p.source.size_bytes // len(slices)
            for i, piece in enumerate(slices):
                tag = f"{prefix}{next(n)}"
                tasks.append(
                    SliceTask(
                        table=p.source.qualified,
                        target=".".join(p.ident),
                        slice_no=i,
                        tag=tag,
                        conninfo=_task_conninfo(self.dsn, tag),
                        snapshot=snapshot,
                        query=copy_query(p.source, piece),
                        columns=p.source.columns,
                        schema=schema,
                        data_dir=data_dir,
                        estimated_bytes=per_slice,
                        storage=Storage.of(p.table.io.properties),
                    )
                )
        tasks.sort(key=lambda t: -t.estimated_bytes)
        return tasks

    def run(self, tasks: list[SliceTask]) -> list[SliceResult]:
        """One Spark job, one partition per slice, biggest first."""
        rdd = self.spark.sparkContext.parallelize(tasks, len(tasks))
        try:
            results: list[SliceResult] = rdd.map(run_slice).collect()
        except Exception as exc:  # an executor died, the job was cancelled, ...
            first = (str(exc).strip().splitlines() or [""])[0][:500]
            raise CopyError(
                f"the copy's Spark job failed: {type(exc).__name__}: {first}",
                table=", ".join(sorted({t.table for t in tasks})),
                hint="nothing of these tables was committed; their copy starts again on the "
                "next run (files the job wrote are unreferenced orphans)",
            ) from exc
        return results


def _task_conninfo(dsn: str, tag: str) -> str:
    return session_conninfo(dsn, application_name=tag, options="-c statement_timeout=0")
