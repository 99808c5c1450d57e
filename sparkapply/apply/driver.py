"""The driver half of an apply: run a batch's table tasks as one Spark job."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import SparkSession

from sparkapply.apply.tasks import TableResult, TableTask, run_table_task


def run_tasks(spark: SparkSession, tasks: Sequence[TableTask]) -> list[TableResult]:
    """One job, one partition per table task, biggest first (they bound the job)."""
    if not tasks:
        return []
    ordered = sorted(tasks, key=lambda t: -sum(s.nbytes for x in t.txns for s in x.segments))
    rdd = spark.sparkContext.parallelize(ordered, len(ordered))
    results: list[TableResult] = rdd.map(run_table_task).collect()
    return results
