"""Iceberg's side of ``verify``: a table's rows at a snapshot, hashed in Spark tasks.

The driver plans the snapshot's file scan tasks (a data file with the position
deletes that apply to it) and ships them, with the table's metadata, to Spark tasks;
each reads its files through pyiceberg's Arrow reader (merge-on-read applied) and
returns only sums per key bucket, or, when narrowing down a difference, the rows of
the buckets asked for. Only those small results cross back to the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata

from sparkapply.convert.types import ColumnTarget
from sparkapply.verify.canonical import arrow_text, row_text, text_bucket, text_hash

Buckets = dict[int, tuple[int, int]]  # bucket -> (rows, sum of row hashes)


@dataclass(frozen=True, slots=True)
class Shape:
    """What is compared of a table: its published columns (names and targets) and
    which of them name a row (none: the whole row does)."""

    columns: tuple[tuple[str, ColumnTarget], ...]
    key: tuple[str, ...]
    buckets: int


@dataclass(frozen=True, slots=True)
class RowTexts:
    """One row as verify sees it: its key's text, its text, each column's text."""

    key: str
    row: str
    values: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class _Task:
    metadata: TableMetadata
    properties: dict[str, str]
    files: tuple[FileScanTask, ...]
    shape: Shape
    snapshot_id: int
    wanted: frozenset[int] | None  # None: sums; else the rows of these buckets


def hash_rows(arrow: pa.Table, shape: Shape) -> list[RowTexts]:
    """The texts of every row of ``arrow`` (the shape's columns, as read)."""
    texts = [arrow_text(arrow.column(name), target) for name, target in shape.columns]
    names = [name for name, _ in shape.columns]
    key_at = [names.index(k) for k in shape.key]
    out = []
    for values in zip(*texts, strict=True) if texts else []:
        row = row_text(values)
        key = row_text([values[i] for i in key_at]) if key_at else row
        out.append(RowTexts(key, row, tuple(values)))
    return out


def sums(rows: Sequence[RowTexts], buckets: int) -> Buckets:
    out: Buckets = {}
    for r in rows:
        b = text_bucket(r.key, buckets)
        n, h = out.get(b, (0, 0))
        out[b] = (n + 1, h + text_hash(r.row))
    return out


def _run(task: _Task) -> tuple[Buckets, list[RowTexts]]:
    io = load_file_io(task.properties, task.metadata.location)
    schema = task.metadata.schema().select(*[name for name, _ in task.shape.columns])
    arrow = ArrowScan(task.metadata, io, schema, AlwaysTrue()).to_table(task.files)
    rows = hash_rows(arrow, task.shape)
    if task.wanted is None:
        return sums(rows, task.shape.buckets), []
    keep = [r for r in rows if text_bucket(r.key, task.shape.buckets) in task.wanted]
    return {}, keep


def _plan(
    table: Table, snapshot_id: int, shape: Shape, wanted: frozenset[int] | None
) -> list[_Task]:
    files = list(table.scan(snapshot_id=snapshot_id).plan_files())
    props = dict(table.io.properties)
    # A few files per task: one task per small file would cost more to schedule than
    # to read.
    per_task = max(1, len(files) // 64 + 1)
    return [
        _Task(table.metadata, props, tuple(files[i : i + per_task]), shape, snapshot_id, wanted)
        for i in range(0, len(files), per_task)
    ]


def mirror_sums(spark: object, table: Table, snapshot_id: int, shape: Shape) -> Buckets:
    """Rows and hash sums per key bucket of ``table`` at ``snapshot_id``."""
    tasks = _plan(table, snapshot_id, shape, None)
    out: Buckets = {}
    for part, _ in _collect(spark, tasks):
        for b, (n, h) in part.items():
            n0, h0 = out.get(b, (0, 0))
            out[b] = (n0 + n, h0 + h)
    return out


def mirror_rows(
    spark: object, table: Table, snapshot_id: int, shape: Shape, wanted: frozenset[int]
) -> list[RowTexts]:
    """The rows of ``table`` at ``snapshot_id`` whose key falls in ``wanted`` buckets."""
    tasks = _plan(table, snapshot_id, shape, wanted)
    return [r for _, rows in _collect(spark, tasks) for r in rows]


def _collect(spark: object, tasks: list[_Task]) -> list[tuple[Buckets, list[RowTexts]]]:
    if not tasks:
        return []
    sc = spark.sparkContext  # type: ignore[attr-defined]
    result: list[tuple[Buckets, list[RowTexts]]] = (
        sc.parallelize(tasks, len(tasks)).map(_run).collect()
    )
    return result
