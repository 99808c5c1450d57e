"""What one Spark task of the copy does: read one slice with COPY, write one Parquet file.

Executor side: imports psycopg, pyarrow and the converters, never pyiceberg or a
SparkSession. The task description and the result are small and picklable; only file
paths go back to the driver, which commits them (or removes them after a failure).

JOINING THE SNAPSHOT
    Each task opens its own connection, with the session settings of the replication
    connection (``datestyle=ISO``, ``extra_float_digits=3``, UTC, hex bytea, UTF8), so
    a value's text is the same as the stream would send. It runs
    ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '<name>'``:
    every slice of every table sees the one snapshot the driver exported.

COPY TEXT FORMAT
    ``COPY (SELECT ...) TO STDOUT`` in text format: one row per line, columns separated
    by tabs, ``\\N`` for NULL, and in values a backslash escapes itself and the
    control characters (``\\b \\f \\n \\r \\t \\v``); PostgreSQL's output uses no other
    escape. Rows are gathered into chunks of ``chunk_bytes``, split into columns by
    Arrow's CSV parser (no quoting, no escape character, so raw tabs and newlines are
    always separators), and a column is unescaped with a few vectorised substring
    replacements, only when it holds a backslash. The unescaped text then goes through
    :func:`sparkapply.convert.values.to_arrow`, the conversion the stream uses.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field

import psycopg
import psycopg.errors
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from sparkapply import location, storage
from sparkapply.apply.write.columns import convert_column, fit_table
from sparkapply.apply.write.parquet import dictionary_columns
from sparkapply.convert.types import PgColumnType
from sparkapply.copy.snapshot import begin_at_snapshot
from sparkapply.errors import (
    ConnectionLostError,
    CopyError,
    SourceError,
    SparkapplyError,
    TableMovedError,
)
from sparkapply.storage import Storage

_COPY_OUT = psycopg.pq.ExecStatus.COPY_OUT
_COMMAND_OK = psycopg.pq.ExecStatus.COMMAND_OK

DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024
"""COPY text gathered before it is parsed and written as one Parquet row group."""

_ESCAPES = (
    ("\\b", "\b"),
    ("\\f", "\f"),
    ("\\n", "\n"),
    ("\\r", "\r"),
    ("\\t", "\t"),
    ("\\v", "\v"),
)
_PARSE = pcsv.ParseOptions(
    delimiter="\t",
    quote_char=False,
    double_quote=False,
    escape_char=False,
    newlines_in_values=False,
    ignore_empty_lines=False,  # a one-column row holding '' is an empty line
)


@dataclass(frozen=True, slots=True)
class SliceTask:
    """One slice of one table, as an executor needs it."""

    table: str  # "schema.table" in PostgreSQL, for messages
    target: str  # "namespace.table" in Iceberg: the driver groups results by it
    slice_no: int
    tag: str  # the connection's application_name; progress finds its COPY by it
    conninfo: str = field(repr=False)  # may hold a password: never logged
    snapshot: str
    query: str
    columns: tuple[tuple[str, PgColumnType], ...]
    schema: pa.Schema  # the Iceberg table's current schema, as Arrow
    data_dir: str
    estimated_bytes: int = 0  # for ordering: biggest slices first
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # The object store's settings, keys included: pickled with the task, never logged.
    storage: Storage = field(kw_only=True)


@dataclass(slots=True)
class SliceResult:
    """What one slice task hands back to the driver: the data files it wrote and their
    counts, or the error that stopped it (picklable, named by its table)."""

    table: str
    target: str
    slice_no: int
    files: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0  # COPY text bytes read
    seconds: float = 0.0
    error: SparkapplyError | None = None


# --------------------------------------------------------------------------------
# COPY text → Arrow
# --------------------------------------------------------------------------------


def parse_copy_text(data: bytes | bytearray, n_columns: int) -> list[pa.Array]:
    """Rows of COPY text format → one ``large_string`` array per column, still escaped,
    ``\\N`` as null."""
    names = [f"c{i}" for i in range(n_columns)]
    convert = pcsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.large_string()),
        null_values=["\\N"],
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )
    # Small blocks parse fastest (cache), but a block must hold a whole row.
    for block_size in (1 << 20, min(len(data) + 1, (1 << 31) - 1)):
        try:
            table = pcsv.read_csv(
                pa.BufferReader(pa.py_buffer(data)),
                read_options=pcsv.ReadOptions(
                    column_names=names, use_threads=False, block_size=block_size
                ),
                parse_options=_PARSE,
                convert_options=convert,
            )
            break
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc) or block_size > len(data):
                raise
    return [table.column(i).combine_chunks() for i in range(n_columns)]


def unescape(values: pa.Array) -> pa.Array:
    """Decode COPY text escapes in a ``large_string`` column (vectorised)."""
    if not pc.any(pc.match_substring(values, "\\")).as_py():
        return values
    # NUL never occurs in PostgreSQL text, so it can stand for an escaped backslash
    # while the other escapes are decoded. Matches are found left to right and do not
    # overlap, so '\\' is always taken as a pair before its second '\' could start one.
    out = pc.replace_substring(values, "\\\\", "\x00")
    if pc.any(pc.match_substring(out, "\\")).as_py():
        for escaped, char in _ESCAPES:
            out = pc.replace_substring(out, escaped, char)
    return pc.replace_substring(out, "\x00", "\\")


def chunk_to_table(
    data: bytes | bytearray,
    columns: tuple[tuple[str, PgColumnType], ...],
    schema: pa.Schema,
) -> pa.Table:
    """Convert a chunk of COPY text rows to a table in ``schema``. Columns the schema
    has and the copy does not (dropped upstream) are null."""
    raw = parse_copy_text(data, len(columns))
    n_rows = len(raw[0]) if raw else 0
    converted: dict[str, pa.Array] = {}
    for (name, ctype), values in zip(columns, raw, strict=True):
        if schema.get_field_index(name) >= 0:
            converted[name] = convert_column(ctype, unescape(values), schema.field(name))
    return fit_table(converted, n_rows, schema)


# --------------------------------------------------------------------------------
# The data file
# --------------------------------------------------------------------------------


class _DataFile:
    """One Parquet file under the table's data directory, written a row group at a time."""

    def __init__(self, data_dir: str, schema: pa.Schema) -> None:
        self.schema = schema
        # The file's location is spelled by joining (as the manifest will hold it); the
        # file system and its path come from that spelling (storage.py).
        self.uri = location.join(data_dir, f"sparkapply-copy-{uuid.uuid4().hex}.parquet")
        self.fs, self.path = storage.filesystem(self.uri)
        storage.make_parent(self.fs, self.path.rsplit("/", 1)[0])
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(
                self.path,
                self.schema,
                filesystem=self.fs,
                use_dictionary=dictionary_columns(table),  # from the file's first rows
            )
        self._writer.write_table(table)

    def close(self) -> list[str]:
        if self._writer is None:
            return []
        self._writer.close()
        return [self.uri]

    def abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            with contextlib.suppress(OSError):
                self.fs.delete_file(self.path)


# --------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------


def run_slice(task: SliceTask) -> SliceResult:
    """Copy one slice. Errors come back in the result, naming the table."""
    result = SliceResult(task.table, task.target, task.slice_no)
    started = time.monotonic()
    out: _DataFile | None = None
    try:
        with storage.using(task.storage):
            out = _DataFile(task.data_dir, task.schema)
            with psycopg.connect(task.conninfo, autocommit=True) as conn:
                begin_at_snapshot(conn, task.snapshot)
                _copy_out(conn, task, out, result)
                conn.execute("COMMIT")
            result.files = out.close()
    except SparkapplyError as exc:
        result.error = exc.with_context(table=task.table)
    except psycopg.Error as exc:
        result.error = _source_error(exc, task)
    except Exception as exc:  # an executor bug must still name the table
        error = storage.refused(exc) or CopyError(f"{type(exc).__name__}: {exc}")
        result.error = error.with_context(table=task.table)
    if result.error is not None and out is not None:
        out.abort()
        result.files = []
    result.seconds = time.monotonic() - started
    return result


def _copy_out(
    conn: psycopg.Connection[object], task: SliceTask, out: _DataFile, result: SliceResult
) -> None:
    """Run the COPY and write its rows in chunks.

    The server sends one CopyData message per row; libpq's ``PQgetCopyData`` is called
    directly (it blocks for the next row) rather than through psycopg's ``Copy``
    iterator, whose per-row generator machinery costs more than parsing the row. Rows
    are appended to one ``bytearray`` (a memcpy each): keeping a Python object per row
    until the chunk is parsed costs four times as much (allocation and the cyclic GC).
    """
    pgconn = conn.pgconn
    pgconn.send_query(task.query.encode())
    while pgconn.flush():
        pass
    res = pgconn.get_result()
    if res is None or res.status != _COPY_OUT:
        _drain(pgconn)
        if res is None:
            raise psycopg.OperationalError(pgconn.get_error_message())
        raise psycopg.errors.error_from_result(res)
    get = pgconn.get_copy_data
    chunk = bytearray()
    limit = task.chunk_bytes
    while True:
        nbytes, row = get(0)
        if nbytes < 0:
            break
        chunk += row
        if len(chunk) >= limit:
            _flush(out, chunk, task, result)
            chunk = bytearray()
    if nbytes == -2:
        raise psycopg.OperationalError(pgconn.get_error_message())
    res = pgconn.get_result()
    _drain(pgconn)
    if res is None or res.status != _COMMAND_OK:
        if res is None:
            raise psycopg.OperationalError(pgconn.get_error_message())
        raise psycopg.errors.error_from_result(res)
    if chunk:
        _flush(out, chunk, task, result)


def _drain(pgconn: psycopg.pq.abc.PGconn) -> None:
    while pgconn.get_result() is not None:
        pass


def _flush(out: _DataFile, chunk: bytearray, task: SliceTask, result: SliceResult) -> None:
    table = chunk_to_table(chunk, task.columns, task.schema)
    out.write(table)
    result.rows += table.num_rows
    result.bytes += len(chunk)


def _source_error(exc: psycopg.Error, task: SliceTask) -> SparkapplyError:
    state = exc.sqlstate or ""
    text = str(exc).strip()
    if state == "22023" and "snapshot" in text:
        # Transient: the exporting replication connection is gone; a new session
        # recovers (see sparkapply.copy.driver, FAILURE AND RESTART).
        return ConnectionLostError(
            f"cannot join the copy's snapshot {task.snapshot}: {text}",
            table=task.table,
            hint="the replication connection that exported it closed; the copy of the "
            "tables not yet committed starts again with the next session",
        )
    if state == "42P01":  # undefined_table: it was there at the snapshot, under that name
        return TableMovedError(
            f"the table was renamed or dropped while it was copied: {text}",
            table=task.table,
            hint="nothing to do: the next session copies the published tables not yet "
            "copied, under the names they have then",
        )
    if isinstance(exc, psycopg.OperationalError) and (not state or state.startswith("08")):
        return ConnectionLostError(f"copy connection lost: {text}", table=task.table)
    return SourceError(
        f"reading the table for the copy failed: {text}",
        table=task.table,
        sqlstate=state or None,
        hint="check that the replication user can SELECT the table and that the "
        "publication's row filter is valid",
    )
