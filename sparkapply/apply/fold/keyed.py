"""The vectorised fold of a keyed table's changes: the net effect per key, in Arrow.

Runs on an executor, for a table with a replica-identity key, over the event kernel
(``events.py``: decoding, event numbers, grouping, gathering rows); this module says
which events a change makes on keys and what a key's events net to. What it cannot
net it leaves to the row-wise fold (``rowwise.py``), which gives the same result:
the tests run both on the same inputs.

EVENTS
    Every change becomes one or two events on a key, numbered in commit order: an
    INSERT or UPDATE *puts* the new row under its new key; an UPDATE that changes the
    key first *removes* the old key; a DELETE *removes* its key. Keys are typed values
    (the key columns' text converted to the table's types), so equal values are equal
    whatever their text spelling or the relation layout they came with.

NET EFFECT
    Sorted by (key, event number), the last event of a key says what the table ends
    with: the row of the last put, or nothing. The first event says whether a
    pre-batch row can exist: a key whose first event is an INSERT's put did not exist
    before the batch (PostgreSQL's key uniqueness), so it needs no lookup; every other
    key touched names a pre-batch row to delete if one is live.

    TRUNCATE empties the table at its position: events before the last one are
    dropped and every pre-batch row goes, so no key needs a lookup.

MANY TASKS PER TABLE
    A task that owns one key-hash partition of a big table keeps only the events of
    its keys, which :func:`sparkapply.plan.partition.owned` names from the keys and
    the renames (the key-changing updates) of the batch; the essay is there.

UNCHANGED TOAST
    An UPDATE may send a column as unchanged (``u``): the row keeps the value it had.
    Within a key's sorted events that is the value of the nearest earlier put that
    sent the column; with none in the batch it is the live pre-batch row's, fetched
    when the replaced row is located (``NetEffect.fills``). An UPDATE that also moves
    the key takes the value from the old key's chain; that rare case goes to the
    row-wise fold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.apply.fold import events
from sparkapply.apply.fold.path import NeedsRowFold
from sparkapply.apply.fold.rowwise import TxnInput
from sparkapply.apply.write.columns import convert_columns
from sparkapply.datafiles import empty_table
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.columnar import ChangeRun
from sparkapply.plan.keys import comparable
from sparkapply.plan.partition import Renames, owned


@dataclass(slots=True)
class NetEffect(events.Counts):
    """What a batch does to a keyed table (typed, in the table's schema)."""

    upserts: pa.Table  # the rows to write: final versions
    remove_keys: list[pa.Array]  # key columns of pre-batch rows to delete, if live
    # Unchanged TOAST values to take from the live pre-batch row: column → mask over
    # ``upserts`` (the rows' keys are among ``remove_keys``).
    fills: dict[str, np.ndarray] = field(default_factory=dict)


def fold_keyed(
    relation_ids: frozenset[int],
    txns: Sequence[TxnInput],
    *,
    schema: pa.Schema,
    key_names: tuple[str, ...],
    proto_version: int = 4,
    streaming: str = "parallel",
    table: str = "?",
    partition: tuple[int, int] = (0, 1),
) -> NetEffect:
    """Fold the table's changes of ``txns`` (commit order). Raises
    :class:`NeedsRowFold` when only the row-wise fold can do it."""
    if any(pa.types.is_nested(schema.field(k).type) for k in key_names):
        raise NeedsRowFold("a key column is an array")
    st = events.collect(relation_ids, txns, schema, key_names, proto_version, streaming, table)
    return events.counted(_net(st, partition), st, txns)


def _typed_keys(part: events.FoldPart, schema: pa.Schema, old: bool) -> list[pa.Array]:
    tuples = part.run.old if old else part.run.new
    layout = part.layout
    cols = convert_columns(
        layout, {layout.names[i]: tuples.values[i] for i in layout.key_idx}, schema
    )
    return [comparable(cols[layout.names[i]]) for i in layout.key_idx]


def _net(st: events.FoldInput, partition: tuple[int, int] = (0, 1)) -> NetEffect:
    effect = NetEffect(empty_table(st.schema), [])
    log, renames = _key_events(st)
    on_keys = log.events()
    if on_keys is None:
        return effect
    if partition[1] > 1:
        keys = [on_keys.table.column(nm).combine_chunks() for nm in on_keys.names]
        on_keys = on_keys.select(owned(keys, renames, partition))
        if on_keys.table.num_rows == 0:
            return effect
    g = on_keys.grouped(nulls_equal=False)
    effect.upserts, effect.fills = _upserts(st, g)
    # Keys that may name a live pre-batch row: first event not an INSERT's put.
    if not st.truncated:
        lookup = g.first & ~(g.put & (g.op == m.TAG_INSERT))
        if lookup.any():
            take = g.order.filter(pa.array(lookup))
            effect.remove_keys = [on_keys.table.column(nm).take(take) for nm in on_keys.names]
    return effect


def _key_events(st: events.FoldInput) -> tuple[events.EventLog, Renames]:
    """The events on keys (see EVENTS), and the keys the updates that move a row
    rename (the edges of the rename graph, for the partitions)."""
    assert st.key_names is not None
    log = events.EventLog(len(st.key_names))
    renames: list[tuple[list[pa.Array], list[pa.Array]]] = []
    for p_i, part in enumerate(st.parts):
        run = part.run
        new_keys = _typed_keys(part, st.schema, old=False)
        if run.has_old.any():
            old_keys = _typed_keys(part, st.schema, old=True)
            moved = _moved(run, new_keys, old_keys)
            if moved.any():
                idx = pa.array(np.flatnonzero(moved))
                renames.append(([k.take(idx) for k in old_keys], [k.take(idx) for k in new_keys]))
            removes = np.flatnonzero((run.ops == m.TAG_DELETE) | moved)
            log.add(p_i, part, removes, old_keys, put=False)
        log.add(p_i, part, np.flatnonzero(run.ops != m.TAG_DELETE), new_keys, put=True)
    return log, renames


def _moved(run: ChangeRun, new_keys: list[pa.Array], old_keys: list[pa.Array]) -> np.ndarray:
    """The UPDATEs whose old key differs from their new one: they move a row."""
    moved: np.ndarray = run.has_old & (run.ops == m.TAG_UPDATE)
    if moved.any():
        differs = np.zeros(len(run.ops), bool)
        for new_c, old_c in zip(new_keys, old_keys, strict=True):
            ne = pc.fill_null(pc.not_equal(new_c, old_c), False)
            differs |= ne.to_numpy(zero_copy_only=False)
        moved &= differs
        if moved.any() and _unchanged_rows(run)[moved].any():
            raise NeedsRowFold("a key-changing update sends unchanged TOAST values")
    return moved


def _upserts(st: events.FoldInput, g: events.Grouped) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """Rows to write: the last event of a key, when it is a put; with the masks of
    the unchanged TOAST values to take from the pre-batch row (``NetEffect.fills``)."""
    sources = _unchanged_sources(st, g)
    offsets = np.cumsum([0, *(len(p.run.ops) for p in st.parts)])
    fills: dict[str, list[np.ndarray]] = {}

    def raw(
        p_i: int, part: events.FoldPart, rows: np.ndarray, at: np.ndarray
    ) -> dict[str, pa.Array]:
        out = dict(zip(part.layout.names, events.at_rows(part.run.new.values, rows), strict=True))
        for name, (src, combined) in sources.items():
            if name not in out:
                fills.setdefault(name, []).append(np.zeros(len(rows), bool))
                continue
            picked = src[at]  # global source row, -1: pre-batch, -2: not unchanged
            take = np.where(picked >= 0, picked, offsets[p_i] + rows)
            out[name] = combined.take(pa.array(take))
            fills.setdefault(name, []).append(picked == -1)
        return out

    upserts = events.gather_rows(st, g, g.last & g.put, raw)
    masks = {name: mask for name, parts in fills.items() if (mask := np.concatenate(parts)).any()}
    return upserts, masks


def _unchanged_rows(run: ChangeRun) -> np.ndarray:
    out = np.zeros(len(run.ops), bool)
    for kind in run.new.kinds:
        out |= kind == m.KIND_UNCHANGED
    return out


def _unchanged_sources(
    st: events.FoldInput, g: events.Grouped
) -> dict[str, tuple[np.ndarray, pa.Array]]:
    """For every column some put sends as unchanged: per sorted event, the global row
    (over all parts) of the nearest earlier put of the same key that sent a value,
    ``-1`` if there is none (take it from the pre-batch row), ``-2`` if the event's
    own value stands; and the column's raw text over all parts, to take from."""
    names: dict[str, None] = {}
    for part in st.parts:
        for i, kind in enumerate(part.run.new.kinds):
            if bool(np.any(kind == m.KIND_UNCHANGED)):
                names[part.layout.names[i]] = None
    if not names:
        return {}
    offsets = np.cumsum([0, *(len(p.run.ops) for p in st.parts)])
    glob = offsets[g.part] + g.row
    ix = np.arange(len(glob))
    group_start = np.maximum.accumulate(np.where(g.first, ix, 0))
    out: dict[str, tuple[np.ndarray, pa.Array]] = {}
    for name in names:
        kinds = np.full(int(offsets[-1]), m.KIND_NULL, np.uint8)
        values = []
        for p_i, part in enumerate(st.parts):
            n = len(part.run.ops)
            if name in part.layout.names:
                ci = part.layout.names.index(name)
                kinds[offsets[p_i] : offsets[p_i] + n] = part.run.new.kinds[ci]
                values.append(part.run.new.values[ci])
            else:  # the column did not exist in this relation version: null
                values.append(pa.nulls(n, pa.large_binary()))
        unchanged = g.put & (kinds[glob] == m.KIND_UNCHANGED)
        has_value = g.put & ~unchanged
        nearest = np.maximum.accumulate(np.where(has_value, ix, -1))
        in_group = nearest >= group_start
        src = np.where(unchanged, np.where(in_group, glob[np.maximum(nearest, 0)], -1), -2).astype(
            np.int64
        )
        out[name] = (src, pa.concat_arrays(values))
    return out
