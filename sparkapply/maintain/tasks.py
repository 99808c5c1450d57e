"""Compaction tasks: rewrite a group of data files without their deleted rows, or merge
delete files. Executor side.

What crosses to an executor is a :class:`RewriteTask` or :class:`MergeDeletesTask`
(paths, sizes, the Arrow schema); what comes back is a :class:`TaskResult` with the
new files' descriptions. A task that fails removes what it wrote and returns the error
(picklable), so the driver commits nothing and has no orphans to chase.

A data group is streamed file by file: each input file's live rows (``apply/write/locate``'s
``live_rows`` with the table's delete files) are conformed to the table's current
schema (columns added later read as null, widened types cast) and appended to the
output file, which is closed and a new one begun once it holds about the target size
(estimated from the input files' bytes per row). Memory is one input file.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkapply.apply.write.locate import DeletedPositions, live_rows
from sparkapply.apply.write.parquet import TableWriter, dictionary_columns, filesystem
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo
from sparkapply.errors import SparkapplyError
from sparkapply.storage import Storage, make_parent, refused, using


@dataclass(frozen=True, slots=True)
class RewriteTask:
    table: str
    files: tuple[DataFileInfo, ...]
    delete_files: tuple[DeleteFileInfo, ...]
    schema: pa.Schema
    data_dir: str
    target_file_size: int
    # The object store's settings, keys included: pickled with the task, never logged.
    storage: Storage = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class MergeDeletesTask:
    table: str
    delete_files: tuple[DeleteFileInfo, ...]
    keep_paths: frozenset[str]  # the data files whose positions the merged file keeps
    schema: pa.Schema
    data_dir: str
    # The object store's settings, keys included: pickled with the task, never logged.
    storage: Storage = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class Moved:
    """Where a rewritten data file's live rows went: to ``path``, from row ``offset``
    on, in order; ``deleted`` (sorted) are the positions not carried over. Enough to
    carry a delete that lands meanwhile over to the new file (``rebase.py``)."""

    path: str
    offset: int
    deleted: np.ndarray


@dataclass(slots=True)
class TaskResult:
    table: str
    added: list[str] = field(default_factory=list)
    deletes: DeleteFileInfo | None = None
    moved: dict[str, Moved] = field(default_factory=dict)  # by rewritten data file
    rows_in: int = 0  # live rows read
    rows_out: int = 0
    bytes_out: int = 0
    error: SparkapplyError | None = None


def run_task(task: RewriteTask | MergeDeletesTask) -> TaskResult:
    """Run one task; never raises (the error is in the result)."""
    with using(task.storage):
        return _run_task(task)


def _run_task(task: RewriteTask | MergeDeletesTask) -> TaskResult:
    result = TaskResult(task.table)
    try:
        if isinstance(task, RewriteTask):
            _rewrite(task, result)
        else:
            _merge_deletes(task, result)
    except Exception as exc:
        _remove(result)
        err = exc if isinstance(exc, SparkapplyError) else refused(exc)
        result.added, result.deletes = [], None
        result.error = err or SparkapplyError(
            f"compaction task failed: {type(exc).__name__}: {exc}",
            table=task.table,
            hint="nothing was committed; the next maintenance run plans again",
        )
    return result


def conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` with exactly ``schema``'s columns: missing ones null, others cast."""
    columns = []
    for f in schema:
        if f.name in t.column_names:
            col = t.column(f.name)
            if col.type != f.type:
                col = _cast(col, f.type)
            columns.append(col)
        else:
            columns.append(pa.nulls(t.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _cast(col: pa.ChunkedArray, to: pa.DataType) -> pa.ChunkedArray:
    if isinstance(to, pa.BaseExtensionType):
        storage = col.cast(to.storage_type)
        return pa.chunked_array(
            [pa.ExtensionArray.from_storage(to, c) for c in storage.chunks], type=to
        )
    return col.cast(to)


class _RollingWriter:
    """Parquet data files of about ``target`` bytes each, under ``data_dir``."""

    def __init__(self, data_dir: str, schema: pa.Schema, target: int, result: TaskResult) -> None:
        self.data_dir = data_dir.rstrip("/")
        self.schema = schema
        self.target = target
        self.result = result
        self.fs, self.dir_path = filesystem(self.data_dir)
        make_parent(self.fs, self.dir_path)
        self._writer: pq.ParquetWriter | None = None
        self._estimate = 0.0
        self._rows = 0  # in the open file

    def write(self, t: pa.Table, bytes_per_row: float) -> tuple[str, int] | None:
        """Append ``t``; the file it went to and its first row there (None if empty)."""
        if t.num_rows == 0:
            return None
        if self._writer is None:
            path = f"{self.dir_path}/sparkapply-{uuid.uuid4().hex}-compacted.parquet"
            self.result.added.append(_uri(self.data_dir, path))
            sink = self.fs.open_output_stream(path)
            # Chosen from the file's first rows: its other rows come from the same table.
            dictionary = dictionary_columns(t)
            self._writer = pq.ParquetWriter(sink, self.schema, use_dictionary=dictionary)
            self._sink = sink
            self._estimate = 0.0
            self._rows = 0
        where = (self.result.added[-1], self._rows)
        self._writer.write_table(t)
        self._rows += t.num_rows
        self.result.rows_out += t.num_rows
        self._estimate += t.num_rows * bytes_per_row
        if self._estimate >= self.target:
            self.close()
        return where

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None


def _rewrite(task: RewriteTask, result: TaskResult) -> None:
    out = _RollingWriter(task.data_dir, task.schema, task.target_file_size, result)
    try:
        # No column list: every column of each file (columns differ across files).
        for rows in live_rows(task.files, task.delete_files, []):
            f = rows.file
            live = rows.live
            kept = conform(rows.table.filter(pa.array(live)), task.schema)
            result.rows_in += kept.num_rows
            per_row = f.file_size_in_bytes / f.record_count if f.record_count else 0.0
            where = out.write(kept, per_row)
            if where is not None:
                result.moved[f.path] = Moved(*where, np.flatnonzero(~live).astype(np.int64))
    finally:
        out.close()
    for uri in result.added:
        fs, path = filesystem(uri)
        result.bytes_out += int(fs.get_file_info(path).size or 0)


def _merge_deletes(task: MergeDeletesTask, result: TaskResult) -> None:
    deleted = DeletedPositions(task.delete_files, sorted(task.keep_paths))
    merged = {p: np.unique(deleted.of(p)) for p in sorted(task.keep_paths)}
    info = TableWriter(task.data_dir, task.schema).write_deletes(merged)
    result.deletes = info
    if info is not None:
        result.rows_out = info.record_count
        result.bytes_out = info.file_size_in_bytes


def _remove(result: TaskResult) -> None:
    paths = [*result.added, *([result.deletes.path] if result.deletes else [])]
    for uri in paths:
        fs, path = filesystem(uri)
        with contextlib.suppress(OSError):  # never committed: the orphan sweep removes it
            fs.delete_file(path)


def _uri(location: str, path: str) -> str:
    if location.startswith("file:"):
        return "file://" + path
    if "://" in location:
        return location.split("://", 1)[0] + "://" + path
    return path
