"""The data files a commit adds, described for their manifest entries.

Executors write plain Parquet (no field ids). Before a commit the driver reads each new
file's footer with pyiceberg's ``parquet_file_to_data_file``: the statistics the
manifest entry records, and the check that the file's columns match the table's schema
through its name mapping (``tables.py``). The reads run in parallel on pyiceberg's
shared thread pool, one footer read per file. A file that is missing, unreadable or
does not match is refused before the catalog is asked: nothing is committed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future

from pyiceberg.io.pyarrow import UnsupportedPyArrowTypeException, parquet_file_to_data_file
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table
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
    futures = [executor.submit(parquet_file_to_data_file, io, metadata, p) for p in paths]
    yield from zip(paths, futures, strict=True)
