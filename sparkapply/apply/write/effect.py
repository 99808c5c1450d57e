"""Write a table's net effect: new row versions as data files, replaced rows as
position deletes (merge-on-read). Executor side.

Inputs are the net effect of the batch on the table, from a vectorised fold
(:class:`~sparkapply.apply.fold.keyed.NetEffect`,
:class:`~sparkapply.apply.fold.full.FullEffect`) or the row-wise fold
(:class:`~sparkapply.apply.fold.rowwise.TableDelta`), and the table it is written to
(a :class:`Target`: the live data and delete files, the writer of new ones). Rows the
batch replaces or deletes are located (``locate.py``) and named in one position-delete
file; new and changed rows go to new data files. Nothing is rewritten, so a batch
writes bytes in proportion to what it changes, not to the table's size.
Only descriptions cross back to the driver, which commits them.

Pure-insert batches never read the table: PostgreSQL's own key uniqueness guarantees
no pre-batch row shares a key with a row inserted now, and the per-table applied LSN
guarantees a batch is not applied twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.apply.fold.full import FullEffect, RemovedImages, layout_columns, removed_images
from sparkapply.apply.fold.keyed import NetEffect
from sparkapply.apply.fold.rowwise import Key, Layout, Row, TableDelta, _Unchanged
from sparkapply.apply.write.columns import convert_column, fit_table
from sparkapply.apply.write.file_cache import remember_columns, remember_positions
from sparkapply.apply.write.locate import key_matcher, key_pruner, live_rows, locate_keys
from sparkapply.apply.write.parquet import TableWriter
from sparkapply.convert.types import PgColumnType
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo, empty_table, python_array
from sparkapply.plan.keys import canonical_keys, comparable

# Rows per data file written by one task (bounded memory, files of a useful size).
ROWS_PER_FILE = 1_000_000


@dataclass(slots=True)
class WriteResult:
    added: list[str] = field(default_factory=list)
    deletes: list[DeleteFileInfo] = field(default_factory=list)
    rows_written: int = 0
    rows_removed: int = 0


@dataclass(frozen=True, slots=True)
class Target:
    """The table a task writes: its schema and live files, the writer of its new
    files, and what they add and delete so far."""

    schema: pa.Schema
    data_files: Sequence[DataFileInfo]
    delete_files: Sequence[DeleteFileInfo]
    writer: TableWriter
    result: WriteResult = field(default_factory=WriteResult)
    # The key the next batches locate rows by: kept in this process's file cache as
    # each data file is written, with each delete file's positions (file_cache.py,
    # WRITTEN HERE). Empty: nothing is kept (a table without a key).
    key_names: tuple[str, ...] = ()

    def write_rows(self, table: pa.Table) -> None:
        kept = self._kept_keys if self.key_names else None
        for start in range(0, table.num_rows, ROWS_PER_FILE):
            part = table.slice(start, ROWS_PER_FILE)
            self.result.added.append(self.writer.write(part, kept))
            self.result.rows_written += part.num_rows

    def write_positions(self, positions: dict[str, np.ndarray]) -> None:
        kept = remember_positions if self.key_names else None
        info = self.writer.write_deletes(positions, kept)
        if info is not None:
            self.result.deletes.append(info)
            self.result.rows_removed += info.record_count

    def _kept_keys(self, uri: str, table: pa.Table) -> None:
        remember_columns(uri, self.key_names, table.select(list(self.key_names)))


def write_effect(effect: NetEffect, key_names: Sequence[str], target: Target) -> WriteResult:
    """Files for the vectorised fold's net effect."""
    upserts = effect.upserts
    if effect.fills:
        upserts = _fill_from_table(effect, key_names, target)
    if not effect.truncated and effect.remove_keys:
        positions = locate_keys(
            effect.remove_keys, key_names, target.data_files, target.delete_files
        )
        target.write_positions(positions)
    target.write_rows(upserts)
    return target.result


def _fill_from_table(effect: NetEffect, key_names: Sequence[str], target: Target) -> pa.Table:
    """Unchanged TOAST values with no earlier version in the batch: the column of the
    key's live pre-batch row (null when there is none: the row was never copied)."""
    upserts = effect.upserts
    need = np.zeros(upserts.num_rows, bool)
    for mask in effect.fills.values():
        need |= mask
    rows = np.flatnonzero(need)
    keys = [comparable(upserts.column(k).take(pa.array(rows))) for k in key_names]
    columns = [c for c in effect.fills if c in upserts.column_names]
    match = key_matcher(keys, key_names)
    found = []
    wanted = [*key_names, *columns]
    for live in live_rows(target.data_files, target.delete_files, wanted, key_pruner(keys)):
        hit = pc.fill_null(match(live.table), False).to_numpy(zero_copy_only=False) & live.live
        if hit.any():
            found.append(live.table.filter(pa.array(hit)))
    if found:
        prior = pa.concat_tables(found).combine_chunks()
    else:
        prior = upserts.select([*key_names, *columns]).slice(0, 0)
    k = [f"__k{i}" for i in range(len(key_names))]
    left = pa.table({**dict(zip(k, keys, strict=True)), "__row": pa.array(rows)})
    # The join carries row numbers, not the values: Acero cannot carry every type
    # (a list of uuid is "not supported in join non-key field"); take can.
    right = pa.table(
        {
            **{
                n: comparable(prior.column(c)).cast(key.type)
                for n, c, key in zip(k, key_names, keys, strict=True)
            },
            "__prior": pa.array(np.arange(prior.num_rows, dtype=np.int64)),
        }
    )
    joined = left.join(right, keys=k, join_type="left outer")
    at = {int(r): i for i, r in enumerate(joined.column("__row").to_pylist())}
    prior_rows = joined.column("__prior").combine_chunks()  # null: no pre-batch row
    for name in columns:
        mask = effect.fills[name]
        col = upserts.column(name).combine_chunks()
        values = prior.column(name).combine_chunks().take(prior_rows)
        if values.type != col.type:
            values = values.cast(col.type)
        take = np.arange(upserts.num_rows)
        sel = np.flatnonzero(mask)
        take[sel] = [upserts.num_rows + at[int(r)] for r in sel]
        merged = pa.concat_arrays([col, values]).take(pa.array(take))
        upserts = upserts.set_column(upserts.schema.get_field_index(name), name, merged)
    return upserts


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
            columns[name] = convert_column(_ctype(layout, ci), raw, schema.field(name))
        parts.append(fit_table(columns, len(idxs), schema))
    if not parts:
        return empty_table(schema), {}
    table = pa.concat_tables(parts)
    # Back to the callers' row order, so indexes line up with ``rows``.
    inverse = [0] * len(order)
    for pos, ri in enumerate(order):
        inverse[ri] = pos
    table = table.take(pa.array(inverse, pa.int64()))
    remapped = {name: [order[i] for i in idxs] for name, idxs in unchanged.items()}
    return table, remapped


def typed_keys(keys: Sequence[Key], layouts: Sequence[Layout], schema: pa.Schema) -> list[pa.Array]:
    """Text key tuples (each read with its layout) as typed key columns of the table."""
    by_layout: dict[Layout, list[Key]] = defaultdict(list)
    for key, layout in zip(keys, layouts, strict=True):
        by_layout[layout].append(key)
    columns: list[list[pa.Array]] = []
    for layout, group in by_layout.items():
        for j, ci in enumerate(layout.key_idx):
            f = schema.field(layout.names[ci])
            arr = convert_column(_ctype(layout, ci), [k[j] for k in group], f)
            if len(columns) <= j:
                columns.append([])
            columns[j].append(arr)
    return [comparable(pa.concat_arrays(parts)) for parts in columns]


def apply_delta(delta: TableDelta, key_names: Sequence[str], target: Target) -> WriteResult:
    """Files for the row-wise fold's net effect."""
    upserts = delta.upserts()
    table, unchanged = rows_to_arrow(upserts, target.schema)
    if delta.mixed:
        if not delta.truncated:
            table = _delete_mixed(delta, upserts, table, unchanged, target)
    elif delta.keyed and not delta.truncated and not delta.only_inserts:
        table = _delete_by_key(delta.remove_keys, key_names, upserts, table, unchanged, target)
    if not delta.keyed and not delta.truncated and delta.removes:
        _delete_full(delta, target)
    target.write_rows(table)
    return target.result


def _delete_by_key(
    removed: dict[Key, Layout],
    key_names: Sequence[str],
    upserts: Sequence[Row],
    table: pa.Table,
    unchanged: dict[str, list[int]],
    target: Target,
) -> pa.Table:
    """Position deletes for the removed keys (of columns ``key_names``); fill
    unchanged TOAST values from the live rows of their source keys. Returns the
    upserts, filled."""
    remove = list(removed)
    keys = typed_keys(remove, [removed[k] for k in remove], target.schema)
    positions = locate_keys(keys, key_names, target.data_files, target.delete_files)
    if unchanged:
        table = _fill_unchanged(table, upserts, unchanged, key_names, remove, keys, target)
    target.write_positions(positions)
    return table


def _delete_mixed(
    delta: TableDelta,
    upserts: Sequence[Row],
    table: pa.Table,
    unchanged: dict[str, list[int]],
    target: Target,
) -> pa.Table:
    """Mixed identities (``fold/rowwise.py``): pre-batch rows removed by key, one
    group of key columns at a time (unchanged TOAST values filled from the rows of
    that group), then by image."""
    for names, removed in delta.remove_by.items():
        mine = {
            c: [i for i in idxs if upserts[i].source_names == names]
            for c, idxs in unchanged.items()
        }
        mine = {c: idxs for c, idxs in mine.items() if idxs}
        table = _delete_by_key(removed, names, upserts, table, mine, target)
    if delta.removes:
        _delete_full(delta, target)
    return table


def _fill_unchanged(
    table: pa.Table,
    upserts: Sequence[Row],
    unchanged: dict[str, list[int]],
    key_names: Sequence[str],
    remove: Sequence[Key],
    keys: Sequence[pa.Array],
    target: Target,
) -> pa.Table:
    """Unchanged TOAST values: the column of the live pre-batch row of the source key
    (every source key is also a removed key: the row it names is replaced)."""
    canon_list = canonical_keys(keys).to_pylist() if keys else []
    canon_of = dict(zip(remove, canon_list, strict=True))
    sources = {canon_of[r.source_key] for r in upserts if r.source_key is not None}
    found: dict[bytes, dict[str, object]] = {}
    fill_cols = sorted(unchanged)
    if sources:
        source_arr = pa.array(sorted(sources), pa.binary())
        wanted = list(dict.fromkeys([*key_names, *fill_cols]))
        for rows in live_rows(target.data_files, target.delete_files, wanted):
            canon = canonical_keys([rows.table.column(k) for k in key_names])
            hit = pc.is_in(canon, value_set=source_arr).to_numpy(zero_copy_only=False) & rows.live
            if not hit.any():
                continue
            mask = pa.array(hit)
            picked = rows.table.filter(mask)
            picked_keys = canon.filter(mask).to_pylist()
            cols = {c: picked.column(c).to_pylist() for c in fill_cols if c in picked.column_names}
            for n, k in enumerate(picked_keys):
                found[k] = {c: vals[n] for c, vals in cols.items()}
    for name, idxs in unchanged.items():
        values = table.column(name).to_pylist()
        for i in idxs:
            src = upserts[i].source_key
            prior = found.get(canon_of.get(src, b"")) if src is not None else None
            # No pre-batch row (never copied): the value is unknown, stored as null.
            values[i] = prior.get(name) if prior else None
        col = python_array(values, target.schema.field(name).type)
        table = table.set_column(table.schema.get_field_index(name), name, col)
    return table


def _delete_full(delta: TableDelta, target: Target) -> None:
    """REPLICA IDENTITY FULL: delete exactly ``count`` live rows equal to each removed
    image (duplicates are a multiset)."""
    schema = target.schema
    wanted: dict[Layout, RemovedImages] = {}
    by_layout: dict[Layout, list[tuple[Key, int]]] = defaultdict(list)
    for (layout, image), count in delta.removes.items():
        by_layout[layout].append((image, count))
    for layout, items in by_layout.items():
        tbl, _ = rows_to_arrow([Row(layout, list(image)) for image, _ in items], schema)
        typed = {n: tbl.column(n) for n in layout_columns(layout, schema)}
        wanted[layout] = removed_images(layout, typed, [count for _, count in items], schema)
    delete_images(wanted, target)


def delete_images(wanted: dict[Layout, RemovedImages], target: Target) -> None:
    """Position deletes for ``count`` live rows equal to each image (canonical, over
    :func:`layout_columns`); the counts in ``wanted`` are used up."""
    positions: dict[str, np.ndarray] = {}
    for live in live_rows(target.data_files, target.delete_files, target.schema.names):
        if not any(images.counts for images in wanted.values()):
            break
        drop = np.zeros(live.table.num_rows, dtype=np.bool_)
        for layout, images in wanted.items():
            remaining = images.counts
            if not remaining:
                continue
            candidates = live.live & np.logical_not(drop)
            near = _near(live.table, images.probe)
            if near is not None:
                candidates &= near
            rows = np.flatnonzero(candidates)
            if not len(rows):
                continue
            sub = live.table.take(pa.array(rows))  # the candidates only: files are big
            names = layout_columns(layout, target.schema)
            canon = canonical_keys([sub.column(n) for n in names])
            hits = pc.is_in(canon, value_set=pa.array(list(remaining), pa.binary()))
            hit_np = hits.to_numpy(zero_copy_only=False)
            if not hit_np.any():
                continue
            keys = canon.filter(pa.array(hit_np)).to_pylist()
            for i, k in zip(rows[hit_np].tolist(), keys, strict=True):
                if remaining.get(k, 0) > 0:
                    remaining[k] -= 1
                    if remaining[k] == 0:
                        del remaining[k]
                    drop[i] = True
        if drop.any():
            positions[live.file.path] = np.flatnonzero(drop)
    target.write_positions(positions)


def _near(table: pa.Table, probe: tuple[str, pa.Array] | None) -> np.ndarray | None:
    """Rows whose probe column holds one of the images' values (None: all may match)."""
    if probe is None:
        return None
    name, values = probe
    if name not in table.column_names:
        return None
    col = table.column(name)
    try:
        if col.type != values.type:  # a file written before a widening
            col = col.cast(values.type)
        near: np.ndarray = pc.is_in(col, value_set=values).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return near


def write_full_effect(effect: FullEffect, target: Target) -> WriteResult:
    """Files for the vectorised REPLICA IDENTITY FULL fold's net effect."""
    if not effect.truncated and effect.removes:
        delete_images(effect.removes, target)
    target.write_rows(effect.upserts)
    return target.result
