"""The data files a commit adds, described for their manifest entries.

Executors write Parquet with the table schema's field ids (``datafiles.py``). Before a
commit the driver reads each new file's footer as pyiceberg's
``parquet_file_to_data_file`` does (:func:`_describe`): the statistics the manifest
entry records, and the check that the file's columns match the table's schema. The
statistics are recorded under the ids of the table schema's columns of the same names,
so the check also requires the file's own ids to be those (:func:`_same_ids`): a file
written in another schema (a column replaced since, ``tables.py``) would otherwise have
its bounds recorded for the wrong field. The reads run in parallel on
pyiceberg's shared thread pool, one footer read per file. A file that is missing,
unreadable or does not match is refused before the catalog is asked: nothing is
committed.

Every file a table's batch adds has the same Arrow schema batch after batch, so the
check is made once per table schema and file schema, and the statistics plan once per
table schema and properties (:class:`_Checks`): converting and comparing the schemas
again for every file was a third of describing it, on a thread that shares the
interpreter lock with the apply. The size comes from the opened file, not another
look-up.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    PYARROW_PARQUET_FIELD_ID_KEY,
    StatisticsCollector,
    UnsupportedPyArrowTypeException,
    _check_pyarrow_schema_compatible,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.concurrent import ExecutorFactory

from sparkapply import location
from sparkapply.errors import SinkArgumentError, SinkError
from sparkapply.lsn import Lsn
from sparkapply.sink.tables import table_name


def as_table_uri(path: str, table: Table) -> str:
    """A plain absolute path as a ``file://`` location when the table lives on the local
    file system, so every file of a table is recorded in one spelling other engines read
    (:mod:`sparkapply.location`)."""
    if path.startswith("/") and location.scheme(table.location()) == location.FILE_SCHEME:
        return location.from_path(path)
    return path


def check_paths(added: Sequence[str], removed: Sequence[str]) -> None:
    if len(set(added)) != len(added):
        raise SinkArgumentError("added data files must be unique")
    if len(set(removed)) != len(removed):
        raise SinkArgumentError("removed data files must be unique")
    if both := set(added) & set(removed):
        raise SinkArgumentError(f"a data file cannot be both added and removed: {sorted(both)[0]}")


def describe_added(table: Table, paths: list[str], lsn: Lsn) -> list[DataFile]:
    """DataFiles for the files a batch adds; a file that cannot be added is a
    :class:`SinkError` naming it and ``lsn``."""
    if not paths:
        return []
    data_files = []
    for path, future in _footers(table, paths):
        try:
            data_files.append(future.result())
        except FileNotFoundError as exc:
            raise SinkError(
                "data file to add does not exist",
                table=table_name(table),
                lsn=lsn,
                file=path,
                hint="nothing was committed",
            ) from exc
        except (ValueError, UnsupportedPyArrowTypeException) as exc:
            raise SinkError(
                f"data file does not match the table schema: {exc}",
                table=table_name(table),
                lsn=lsn,
                file=path,
                hint="nothing was committed; executors must write the table's column names "
                "and Arrow types (key columns non-nullable, timestamps in us)",
            ) from exc
        except OSError as exc:
            raise SinkError(
                f"cannot read data file to add: {exc}", table=table_name(table), lsn=lsn, file=path
            ) from exc
    return data_files


def describe_rewritten(table: Table, paths: Sequence[str]) -> list[DataFile]:
    """DataFiles for the files a compaction rewrote (``rewrite.py``)."""
    out = []
    for path, future in _footers(table, paths):
        try:
            data_file = future.result()
        except Exception as exc:
            raise SinkError(
                f"cannot add rewritten data file: {type(exc).__name__}: {exc}",
                table=table_name(table),
                file=path,
                hint="nothing was committed; the rewritten files are orphans",
            ) from exc
        if data_file.content != DataFileContent.DATA:
            raise SinkError("not a data file", table=table_name(table), file=path)
        out.append(data_file)
    return out


def _footers(table: Table, paths: Sequence[str]) -> Iterator[tuple[str, Future[DataFile]]]:
    """Every footer read submitted at once; each path with its pending result."""
    metadata, io = table.metadata, table.io
    executor = ExecutorFactory.get_or_create()
    futures = [executor.submit(_describe, io, metadata, p) for p in paths]
    yield from zip(paths, futures, strict=True)


_MAX_KEPT = 4096  # checks and plans kept: far more than tables x schemas

_StatsPlan = tuple[dict[int, StatisticsCollector], dict[str, int]]


class _Checks:
    """Schema checks passed and statistics plans, by table schema (see the module doc).
    A check that fails is not kept: the next file is checked again."""

    def __init__(self) -> None:
        self._passed: set[tuple[str, int, int, pa.Schema]] = set()
        self._plans: dict[tuple[str, int, tuple[tuple[str, str], ...]], _StatsPlan] = {}
        self._lock = threading.Lock()

    def check(self, metadata: TableMetadata, file_schema: pa.Schema) -> None:
        key = (
            str(metadata.table_uuid),
            metadata.current_schema_id,
            metadata.format_version,
            file_schema,
        )
        with self._lock:
            if key in self._passed:
                return
        _check_pyarrow_schema_compatible(
            metadata.schema(), file_schema, format_version=metadata.format_version
        )
        _same_ids(metadata, file_schema)
        with self._lock:
            if len(self._passed) >= _MAX_KEPT:  # schemas come and go: start over
                self._passed.clear()
            self._passed.add(key)

    def plan(self, metadata: TableMetadata) -> _StatsPlan:
        key = (
            str(metadata.table_uuid),
            metadata.current_schema_id,
            tuple(sorted(metadata.properties.items())),
        )
        with self._lock:
            found = self._plans.get(key)
        if found is None:
            schema = metadata.schema()
            found = (
                compute_statistics_plan(schema, metadata.properties),
                parquet_path_to_id_mapping(schema),
            )
            with self._lock:
                if len(self._plans) >= _MAX_KEPT:
                    self._plans.clear()
                self._plans[key] = found
        return found


_CHECKS = _Checks()


def _same_ids(metadata: TableMetadata, file_schema: pa.Schema) -> None:
    """A file with field ids holds each column under the id the table's schema gives
    its name (ValueError naming the first that does not); one without ids (written
    before sparkapply wrote them) is resolved by name, through the name mapping."""
    if not any(f.metadata and PYARROW_PARQUET_FIELD_ID_KEY in f.metadata for f in file_schema):
        return
    held = parquet_path_to_id_mapping(pyarrow_to_schema(file_schema))
    wanted = parquet_path_to_id_mapping(metadata.schema())
    for path, field_id in held.items():
        if wanted.get(path) != field_id:
            raise ValueError(
                f"column {path} has field id {field_id} in the file, "
                f"{wanted.get(path)} in the table schema {metadata.current_schema_id}"
            )


def _describe(io: FileIO, metadata: TableMetadata, path: str) -> DataFile:
    """pyiceberg's ``parquet_file_to_data_file``, with the schema check and the
    statistics plan made once per table schema (see the module doc)."""
    file = io.new_input(path)
    with file.open() as stream:
        footer = pq.read_metadata(stream)
        size_of = getattr(stream, "size", None)  # a pyarrow NativeFile's; fsspec's is not
        size = size_of() if callable(size_of) else len(file)
    _CHECKS.check(metadata, footer.schema.to_arrow_schema())
    stats_columns, column_ids = _CHECKS.plan(metadata)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=stats_columns,
        parquet_column_mapping=column_ids,
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=statistics.partition(metadata.spec(), metadata.schema()),
        file_size_in_bytes=int(size),
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
