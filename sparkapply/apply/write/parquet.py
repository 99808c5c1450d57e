"""Files an apply task writes: Parquet data files and position-delete files. Executor side.

Names are UUIDs, unique forever: a name reused after a failed commit could collide with
a file a reader still needs. Only descriptions cross back to the driver, which commits
them; a file written here and never committed is an orphan the driver removes.

Position-delete files follow the Iceberg spec: columns ``file_path`` (string) and
``pos`` (long) with the reserved field ids, both required, sorted by path then
position, so readers that merge them with a data file's rows can stream them.

DICTIONARIES
    A data file dictionary-encodes only the columns whose values repeat
    (:func:`dictionary_columns`): pyarrow's default tries it on every column and falls
    back to plain once a column's dictionary grows past a page, after hashing it. On
    60,000 rows of the benchmarks' orders table (a key, an int, a numeric, a status of
    four values, a timestamp, an md5 text), timed ad hoc, the default took 31.6 ms and
    wrote 3.55 MB; a dictionary for the status alone, 16.2 ms and 3.03 MB. Staging a
    streamed transaction's piece spent 40% of its task writing its rows (py-spy), on
    a core the walsender needs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkapply import location, storage
from sparkapply.datafiles import FILE_PATH_FIELD_ID, POS_FIELD_ID, DeleteFileInfo
from sparkapply.plan.keys import ascending

POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.string(),
            nullable=False,
            metadata={b"PARQUET:field_id": str(FILE_PATH_FIELD_ID).encode()},
        ),
        pa.field(
            "pos",
            pa.int64(),
            nullable=False,
            metadata={b"PARQUET:field_id": str(POS_FIELD_ID).encode()},
        ),
    ]
)
# As written: the same Parquet file, its paths handed over as a dictionary.
_DICTIONARY_DELETE_SCHEMA = POSITION_DELETE_SCHEMA.set(
    0, POSITION_DELETE_SCHEMA.field(0).with_type(pa.dictionary(pa.int32(), pa.string()))
)


# Rows looked at to choose the dictionary columns; a file of no more rows than this
# takes pyarrow's default (every column), which costs nothing worth choosing for.
DICTIONARY_SAMPLE = 1024


def dictionary_columns(table: pa.Table) -> list[str] | bool:
    """``use_dictionary`` for a data file of ``table`` (see DICTIONARIES): the flat
    columns whose first :data:`DICTIONARY_SAMPLE` values hold at most half as many
    distinct ones; True (all) for a small table."""
    if table.num_rows <= DICTIONARY_SAMPLE:
        return True
    sample = table.slice(0, DICTIONARY_SAMPLE)
    chosen = []
    for field in table.schema:
        if pa.types.is_nested(field.type):
            continue
        col = sample.column(field.name).combine_chunks()
        if isinstance(col.type, pa.BaseExtensionType):
            col = col.storage
        try:
            distinct = pc.count_distinct(col, mode="all").as_py()
        except pa.ArrowNotImplementedError:
            continue
        if 2 * distinct <= len(col):
            chosen.append(field.name)
    return chosen


def filesystem(where: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system and path of a location, under the storage settings in
    force (:mod:`sparkapply.storage`: the task's)."""
    return storage.filesystem(where)


def _uri(where: str, path: str) -> str:
    # ``path`` is a file directly under the directory ``where``.
    return location.join(where, path.rsplit("/", 1)[-1])


def read_parquet(file_uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    """``columns`` of a data file, in that order. A column the file does not have (it
    was added to the table after the file was written) reads as nulls, as Iceberg
    readers read it (typed null: it matches no key and no image value).

    One file, read as one file: ``pq.read_table`` builds a dataset around it, which
    doubled the time of reading the small files a steady stream writes (0.6 against
    0.3 ms for a hundred rows), read by every batch's locate and every compaction."""
    fs, path = filesystem(file_uri)
    wanted = list(columns) if columns else None
    with fs.open_input_file(path) as stream:
        parquet = pq.ParquetFile(stream)
        present = set(parquet.schema_arrow.names)
        if wanted is None or present.issuperset(wanted):
            return parquet.read(columns=wanted)
        table = parquet.read(columns=[c for c in wanted if c in present])
    return pa.table(
        {
            c: table.column(c) if c in present else pa.nulls(table.num_rows, pa.null())
            for c in wanted
        }
    )


class TableWriter:
    """Writes one table's files under ``data_dir`` (a URI or local path)."""

    def __init__(self, data_dir: str, schema: pa.Schema, *, prefix: str = "sparkapply-") -> None:
        self.data_dir = data_dir.rstrip("/")
        self.schema = schema
        self.prefix = prefix  # of every file name; staging finds its files by it
        self.fs, self.dir_path = filesystem(self.data_dir)
        storage.make_parent(self.fs, self.dir_path)
        self.seconds = 0.0  # spent writing files (the task reports it as its own phase)

    def _new_path(self, suffix: str) -> str:
        return f"{self.dir_path}/{self.prefix}{uuid.uuid4().hex}{suffix}.parquet"

    def write(self, table: pa.Table, written: Callable[[str, pa.Table], None] | None = None) -> str:
        """A data file with ``table`` (cast to the table schema); its URI. ``written``
        is told the URI and the table as the file holds it."""
        started = time.perf_counter()
        path = self._new_path("")
        table = table.cast(self.schema)
        pq.write_table(table, path, filesystem=self.fs, use_dictionary=dictionary_columns(table))
        self.seconds += time.perf_counter() - started
        uri = _uri(self.data_dir, path)
        if written is not None:
            written(uri, table)
        return uri

    def write_keys(self, keys: pa.Table) -> str:
        """A file of key columns as they are (a staged piece's removes, never a data
        file of the table: ``staging/piece.py``); its URI."""
        started = time.perf_counter()
        path = self._new_path("-keys")
        pq.write_table(keys, path, filesystem=self.fs, use_dictionary=dictionary_columns(keys))
        self.seconds += time.perf_counter() - started
        return _uri(self.data_dir, path)

    def write_deletes(
        self,
        positions: Mapping[str, np.ndarray],
        written: Callable[[str, dict[str, np.ndarray]], None] | None = None,
    ) -> DeleteFileInfo | None:
        """One position-delete file naming ``positions`` (data file URI → row numbers).
        ``written`` is told its URI and the positions it holds, sorted, by data file."""
        paths = sorted(p for p, pos in positions.items() if len(pos))
        if not paths:
            return None
        started = time.perf_counter()
        pos_arrays = [ascending(np.asarray(positions[p], np.int64)) for p in paths]
        counts = [len(a) for a in pos_arrays]
        # The paths as a dictionary, which Parquet dictionary-encodes as it is: a plain
        # column of a million long paths costs the writer a hash of each (0.1 s per
        # 500,000). The file is the same (``store_schema=False``: no Arrow schema
        # that would tell readers the column is a dictionary).
        indices = pa.array(np.repeat(np.arange(len(paths), dtype=np.int32), counts))
        table = pa.Table.from_arrays(
            [
                pa.DictionaryArray.from_arrays(indices, pa.array(paths, pa.string())),
                pa.array(np.concatenate(pos_arrays), pa.int64()),
            ],
            schema=_DICTIONARY_DELETE_SCHEMA,
        )
        path = self._new_path("-deletes")
        pq.write_table(table, path, filesystem=self.fs, store_schema=False)
        size = self.fs.get_file_info(path).size
        self.seconds += time.perf_counter() - started
        if written is not None:
            written(_uri(self.data_dir, path), dict(zip(paths, pos_arrays, strict=True)))
        return DeleteFileInfo(
            path=_uri(self.data_dir, path),
            record_count=table.num_rows,
            file_size_in_bytes=int(size or 0),
            lower_path=paths[0],
            upper_path=paths[-1],
            lower_pos=int(min(int(a[0]) for a in pos_arrays)),
            upper_pos=int(max(int(a[-1]) for a in pos_arrays)),
        )
