"""Write a table's net effect as Parquet data files (copy-on-write). Executor side.

Inputs are a :class:`~sparkapply.apply.fold.TableDelta` and the table's live data
files. Files that hold rows the batch removes are rewritten without them; new and
changed rows go to a new file. Only paths cross back to the driver, which commits
them; a file written here and never committed is an orphan the driver removes.

Pure-insert batches on keyed tables never read the table: PostgreSQL's own key
uniqueness guarantees no pre-batch row shares a key with a row inserted now, and the
per-table applied LSN guarantees a batch is not applied twice.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkapply import location
from sparkapply.apply.fold import Key, Layout, Row, TableDelta, _Unchanged
from sparkapply.apply.keys import canonical_keys
from sparkapply.convert.types import PgColumnType
from sparkapply.convert.values import to_arrow
from sparkapply.errors import ConversionError, SparkapplyError


@dataclass(slots=True)
class WriteResult:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rows_written: int = 0
    rows_removed: int = 0


def _fs(where: str) -> tuple[pafs.FileSystem, str]:
    return location.filesystem(where)


def _uri(where: str, path: str) -> str:
    # ``path`` is a file directly under the directory ``where`` (see TableWriter.write).
    return location.join(where, path.rsplit("/", 1)[-1])


class TableWriter:
    """Writes data files for one table under ``data_dir`` (a URI or local path)."""

    def __init__(self, data_dir: str, schema: pa.Schema) -> None:
        self.data_dir = data_dir.rstrip("/")
        self.schema = schema
        self.fs, self.dir_path = _fs(self.data_dir)
        self.fs.create_dir(self.dir_path, recursive=True)

    def write(self, table: pa.Table) -> str:
        name = f"sparkapply-{uuid.uuid4().hex}.parquet"
        path = f"{self.dir_path}/{name}"
        pq.write_table(table.cast(self.schema), path, filesystem=self.fs)
        return _uri(self.data_dir, path)

    def read(self, file_uri: str, columns: Sequence[str] | None = None) -> pa.Table:
        fs, path = _fs(file_uri)
        t = pq.read_table(path, filesystem=fs, columns=list(columns) if columns else None)
        return t


def _ctype(layout: Layout, i: int) -> PgColumnType:
    return PgColumnType(layout.type_oids[i], layout.type_modifiers[i])


def rows_to_arrow(rows: Sequence[Row], schema: pa.Schema) -> tuple[pa.Table, dict[str, list[int]]]:
    """Convert rows (possibly of several layouts) to one table in ``schema``.

    Returns the table and, per column, the row indexes whose value is still
    UNCHANGED (to be filled from the pre-batch row).
    """
    by_layout: dict[Layout, list[int]] = defaultdict(list)
    for idx, row in enumerate(rows):
        by_layout[row.layout].append(idx)
    parts = []
    order: list[int] = []
    unchanged: dict[str, list[int]] = defaultdict(list)
    for layout, idxs in by_layout.items():
        base = len(order)
        order.extend(idxs)
        columns = {}
        for ci, name in enumerate(layout.names):
            if schema.get_field_index(name) < 0:
                continue
            raw = []
            for j, ri in enumerate(idxs):
                v = rows[ri].values[ci]
                if isinstance(v, _Unchanged):
                    unchanged[name].append(base + j)
                    v = None
                raw.append(v)
            try:
                arr = to_arrow(_ctype(layout, ci), raw)
            except SparkapplyError as exc:
                raise exc.with_context(column=name) from None
            columns[name] = arr
        arrays = []
        for f in schema:
            arr = columns.get(f.name)
            if arr is None:
                arrays.append(pa.nulls(len(idxs), f.type))
            else:
                try:
                    arrays.append(arr.cast(f.type) if arr.type != f.type else arr)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ConversionError(
                        f"cannot store {arr.type} values in column of type {f.type}: {exc}",
                        column=f.name,
                    ) from exc
        parts.append(pa.Table.from_arrays(arrays, schema=schema))
    if not parts:
        return schema.empty_table(), {}
    table = pa.concat_tables(parts)
    # Back to the callers' row order, so indexes line up with ``rows``.
    inverse = [0] * len(order)
    for pos, ri in enumerate(order):
        inverse[ri] = pos
    table = table.take(pa.array(inverse, pa.int64()))
    remapped = {name: [order[i] for i in idxs] for name, idxs in unchanged.items()}
    return table, remapped


def keys_to_canonical(keys: Mapping[Key, Layout], schema: pa.Schema) -> dict[Key, bytes]:
    """Canonical keys of text key tuples, via the same typed path as table rows."""
    by_layout: dict[Layout, list[Key]] = defaultdict(list)
    for key, layout in keys.items():
        by_layout[layout].append(key)
    out: dict[Key, bytes] = {}
    for layout, group in by_layout.items():
        cols = []
        for j, ci in enumerate(layout.key_idx):
            f = schema.field(layout.names[ci])
            arr = to_arrow(_ctype(layout, ci), [k[j] for k in group])
            cols.append(arr.cast(f.type) if arr.type != f.type else arr)
        out.update(zip(group, canonical_keys(cols).to_pylist(), strict=True))
    return out


def apply_delta(
    delta: TableDelta,
    *,
    schema: pa.Schema,
    key_names: Sequence[str],
    data_files: Sequence[str],
    writer: TableWriter,
) -> WriteResult:
    result = WriteResult()
    upserts = delta.upserts()
    table, unchanged = rows_to_arrow(upserts, schema)

    if delta.truncated:
        result.removed.extend(data_files)
    elif delta.keyed and not delta.only_inserts:
        _rewrite_keyed(
            delta, upserts, table, unchanged, schema, key_names, data_files, writer, result
        )
        return result
    elif not delta.keyed and delta.removes:
        _rewrite_full(delta, schema, data_files, writer, result)

    if table.num_rows:
        result.added.append(writer.write(table))
        result.rows_written += table.num_rows
    return result


def _rewrite_keyed(
    delta: TableDelta,
    upserts: Sequence[Row],
    table: pa.Table,
    unchanged: dict[str, list[int]],
    schema: pa.Schema,
    key_names: Sequence[str],
    data_files: Sequence[str],
    writer: TableWriter,
    result: WriteResult,
) -> None:
    canon_of = keys_to_canonical(delta.remove_keys, schema)
    remove = pa.array(list(set(canon_of.values())), pa.binary()) if canon_of else None
    # Every source key is also a removed key (the row it names is replaced).
    sources = {canon_of[r.source_key] for r in upserts if r.source_key is not None}
    source_canon = pa.array(list(sources), pa.binary()) if sources else None
    found: dict[bytes, dict[str, object]] = {}
    fill_cols = sorted(unchanged)
    for path in data_files:
        keys_tbl = writer.read(path, key_names)
        canon = canonical_keys([keys_tbl.column(k) for k in key_names])
        hit_remove = pc.is_in(canon, value_set=remove) if remove is not None else None
        hit_source = pc.is_in(canon, value_set=source_canon) if source_canon is not None else None
        any_remove = bool(hit_remove is not None and pc.any(hit_remove).as_py())
        any_source = bool(hit_source is not None and pc.any(hit_source).as_py())
        if not any_remove and not any_source:
            continue
        full = writer.read(path)
        if any_source and hit_source is not None:
            picked = full.filter(hit_source)
            picked_keys = canon.filter(hit_source).to_pylist()
            cols = {c: picked.column(c).to_pylist() for c in fill_cols if c in picked.column_names}
            for i, k in enumerate(picked_keys):
                found[k] = {c: vals[i] for c, vals in cols.items()}
        if any_remove and hit_remove is not None:
            kept = full.filter(pc.invert(hit_remove))
            result.removed.append(path)
            result.rows_removed += full.num_rows - kept.num_rows
            if kept.num_rows:
                result.added.append(writer.write(kept))
                result.rows_written += kept.num_rows
    if unchanged:
        table = _fill_unchanged(table, upserts, unchanged, found, schema, canon_of)
    if table.num_rows:
        result.added.append(writer.write(table))
        result.rows_written += table.num_rows


def _fill_unchanged(
    table: pa.Table,
    upserts: Sequence[Row],
    unchanged: dict[str, list[int]],
    found: dict[bytes, dict[str, object]],
    schema: pa.Schema,
    canon_of: Mapping[Key, bytes],
) -> pa.Table:
    for name, idxs in unchanged.items():
        values = table.column(name).to_pylist()
        for i in idxs:
            src = upserts[i].source_key
            prior = found.get(canon_of.get(src, b"")) if src is not None else None
            # No pre-batch row (never copied): the value is unknown, stored as null.
            values[i] = prior.get(name) if prior else None
        col = pa.array(values, type=schema.field(name).type)
        table = table.set_column(table.schema.get_field_index(name), name, col)
    return table


def _rewrite_full(
    delta: TableDelta,
    schema: pa.Schema,
    data_files: Sequence[str],
    writer: TableWriter,
    result: WriteResult,
) -> None:
    # Pre-batch rows to remove, grouped by the layout whose columns identify them.
    wanted: dict[Layout, dict[bytes, int]] = defaultdict(dict)
    by_layout: dict[Layout, list[tuple[Key, int]]] = defaultdict(list)
    for (layout, image), count in delta.removes.items():
        by_layout[layout].append((image, count))
    for layout, items in by_layout.items():
        rows = [Row(layout, list(image)) for image, _ in items]
        tbl, _ = rows_to_arrow(rows, schema)
        names = [n for n in layout.names if schema.get_field_index(n) >= 0]
        canon = canonical_keys([tbl.column(n) for n in names]).to_pylist()
        for c, (_, count) in zip(canon, items, strict=True):
            wanted[layout][c] = wanted[layout].get(c, 0) + count
    for path in data_files:
        if not any(wanted.values()):
            break
        full = writer.read(path)
        drop = [False] * full.num_rows
        touched = False
        for layout, remaining in wanted.items():
            if not remaining:
                continue
            names = [n for n in layout.names if schema.get_field_index(n) >= 0]
            canon = canonical_keys([full.column(n) for n in names])
            hits = pc.is_in(canon, value_set=pa.array(list(remaining), pa.binary()))
            if not pc.any(hits).as_py():
                continue
            keys = canon.to_pylist()
            for i in pc.indices_nonzero(hits).to_pylist():
                if drop[i]:
                    continue
                k = keys[i]
                if remaining.get(k, 0) > 0:
                    remaining[k] -= 1
                    if remaining[k] == 0:
                        del remaining[k]
                    drop[i] = True
                    touched = True
        if touched:
            kept = full.filter(pa.array([not d for d in drop]))
            result.removed.append(path)
            result.rows_removed += full.num_rows - kept.num_rows
            if kept.num_rows:
                result.added.append(writer.write(kept))
                result.rows_written += kept.num_rows
