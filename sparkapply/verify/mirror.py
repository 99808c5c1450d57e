"""Iceberg's side of ``verify``: a table's rows at a snapshot, hashed in Spark tasks.

The driver plans the snapshot's file scan tasks (a data file with the position
deletes that apply to it) and ships them, with the table's metadata, to Spark tasks;
each reads its files through pyiceberg's Arrow reader (merge-on-read applied) and
returns only sums per bucket, or, when narrowing down a difference, the rows of
the buckets asked for. Only those small results cross back to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata

from sparkapply.convert.types import ColumnTarget
from sparkapply.datafiles import empty_table
from sparkapply.verify.canonical import (
    HASH_MOD,
    arrow_hashes,
    arrow_row_texts,
    arrow_texts,
    row_text,
)

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


@dataclass(frozen=True, slots=True)
class _Texts:
    """A batch of rows: each column's texts, each row's hash and bucket."""

    columns: list[pa.Array]
    hashes: npt.NDArray[np.int64]
    buckets: npt.NDArray[np.int64]


def _texts(arrow: pa.Table, shape: Shape) -> _Texts:
    columns = [arrow_texts(arrow.column(name), target) for name, target in shape.columns]
    if not columns:  # no published column: every row is the empty text
        columns = [pa.array([""] * arrow.num_rows, pa.string())]
    hashes, prefixes = arrow_hashes(columns)
    return _Texts(columns, hashes, prefixes.astype(np.int64) % shape.buckets)


def sums(arrow: pa.Table, shape: Shape) -> Buckets:
    """Rows and hash sums (mod 2^64) per bucket of ``arrow``'s rows."""
    texts = _texts(arrow, shape)
    counts = np.bincount(texts.buckets, minlength=shape.buckets)
    totals = np.zeros(shape.buckets, dtype=np.int64)
    np.add.at(totals, texts.buckets, texts.hashes)  # wraps: the sum is mod 2^64
    return {b: (int(counts[b]), int(totals[b]) % HASH_MOD) for b in np.flatnonzero(counts).tolist()}


def add_buckets(into: Buckets, part: Buckets) -> None:
    """Add ``part``'s rows and sums to ``into``'s, bucket by bucket."""
    for b, (n, h) in part.items():
        n0, h0 = into.get(b, (0, 0))
        into[b] = (n0 + n, (h0 + h) % HASH_MOD)


def rows_in(arrow: pa.Table, shape: Shape, wanted: frozenset[int]) -> list[RowTexts]:
    """The rows of ``arrow`` that fall in ``wanted`` buckets, with their texts."""
    texts = _texts(arrow, shape)
    at = pa.array(np.flatnonzero(np.isin(texts.buckets, sorted(wanted))))
    picked = [c.take(at) for c in texts.columns]
    values = [c.to_pylist() for c in picked]
    names = [name for name, _ in shape.columns]
    key_at = [names.index(k) for k in shape.key]
    out = []
    for i, row in enumerate(arrow_row_texts(picked).to_pylist()):
        cells = tuple(v[i] for v in values)
        key = row_text([cells[k] for k in key_at]) if key_at else row
        out.append(RowTexts(key, row, cells))
    return out


def _run(task: _Task) -> tuple[Buckets, list[RowTexts]]:
    io = load_file_io(task.properties, task.metadata.location)
    schema = task.metadata.schema().select(*[name for name, _ in task.shape.columns])
    scan = ArrowScan(task.metadata, io, schema, AlwaysTrue())
    out: Buckets = {}
    rows: list[RowTexts] = []
    arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
    for file in task.files:  # one at a time: a task's files together may not fit
        arrow = _read(scan, file, arrow_schema)
        if task.wanted is not None:
            rows.extend(rows_in(arrow, task.shape, task.wanted))
            continue
        add_buckets(out, sums(arrow, task.shape))
    return out, rows


def _read(scan: ArrowScan, file: FileScanTask, arrow_schema: pa.Schema) -> pa.Table:
    """``ArrowScan.to_table([file])``, also when no row is left: pyiceberg then makes
    ``arrow_schema.empty_table()``, which pyarrow cannot for a list of uuid."""
    tables = [pa.Table.from_batches([b]) for b in scan.to_record_batches([file])]
    if not tables:
        return empty_table(arrow_schema)
    return pa.concat_tables(tables, promote_options="permissive")


def _plan(
    spark: object, table: Table, snapshot_id: int, shape: Shape, wanted: frozenset[int] | None
) -> list[_Task]:
    files = list(table.scan(snapshot_id=snapshot_id).plan_files())
    props = dict(table.io.properties)
    # Two tasks a core, the files dealt largest first to the lightest task: a Python
    # task costs tens of milliseconds to launch, a file per task would cost more
    # to schedule than to read, and two a core evens out what the sizes do not.
    cores = max(1, spark.sparkContext.defaultParallelism)  # type: ignore[attr-defined]
    groups: list[list[FileScanTask]] = [[] for _ in range(min(len(files), 2 * cores))]
    loads = [0] * len(groups)
    for file in sorted(files, key=lambda f: -f.file.file_size_in_bytes):
        lightest = loads.index(min(loads))
        groups[lightest].append(file)
        loads[lightest] += file.file.file_size_in_bytes
    return [
        _Task(table.metadata, props, tuple(group), shape, snapshot_id, wanted) for group in groups
    ]


def mirror_sums(spark: object, table: Table, snapshot_id: int, shape: Shape) -> Buckets:
    """Rows and hash sums per bucket of ``table`` at ``snapshot_id``."""
    tasks = _plan(spark, table, snapshot_id, shape, None)
    out: Buckets = {}
    for part, _ in _collect(spark, tasks):
        add_buckets(out, part)
    return out


def mirror_rows(
    spark: object, table: Table, snapshot_id: int, shape: Shape, wanted: frozenset[int]
) -> list[RowTexts]:
    """The rows of ``table`` at ``snapshot_id`` that fall in ``wanted`` buckets."""
    tasks = _plan(spark, table, snapshot_id, shape, wanted)
    return [r for _, rows in _collect(spark, tasks) for r in rows]


def _collect(spark: object, tasks: list[_Task]) -> list[tuple[Buckets, list[RowTexts]]]:
    if not tasks:
        return []
    sc = spark.sparkContext  # type: ignore[attr-defined]
    result: list[tuple[Buckets, list[RowTexts]]] = (
        sc.parallelize(tasks, len(tasks)).map(_run).collect()
    )
    return result
