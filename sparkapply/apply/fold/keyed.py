"""The vectorised fold of a keyed table's changes: the net effect per key, in Arrow.

Runs on an executor, for a table with a replica-identity key whose batch sends no
unchanged TOAST value (those go through the row-wise fold in ``fold.py``, which gives
the same result: the tests run both on the same inputs).

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
    A big table's batch is folded by several tasks, each owning the keys whose hash
    falls in its partition. Events on different keys are independent, except where
    an UPDATE moves a row from one key to another: the keys it links are nodes of a
    graph whose edges are those updates (networkx), and every key of a connected
    component goes to the partition of the component's smallest key, so a chain of
    renames is folded by one task. Every task decodes the whole batch and computes
    the same graph and the same partitions (it is deterministic), so no second job
    and no shuffle is needed; each writes the rows and position deletes of its own
    keys, and the driver commits all of them as one snapshot.

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

from sparkapply.apply.fold.events import (
    EventLog,
    Events,
    FoldInput,
    FoldPart,
    Grouped,
    collect,
    gather_rows,
)
from sparkapply.apply.fold.path import NeedsRowFold
from sparkapply.apply.fold.rowwise import TxnInput
from sparkapply.apply.write.columns import convert_columns
from sparkapply.apply.write.keys import canonical_keys, comparable
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.columnar import ChangeRun


@dataclass(slots=True)
class NetEffect:
    """What a batch does to a keyed table (typed, in the table's schema)."""

    upserts: pa.Table  # the rows to write: final versions
    remove_keys: list[pa.Array]  # key columns of pre-batch rows to delete, if live
    truncated: bool = False
    # Unchanged TOAST values to take from the live pre-batch row: column → mask over
    # ``upserts`` (the rows' keys are among ``remove_keys``).
    fills: dict[str, np.ndarray] = field(default_factory=dict)
    n_inserts: int = 0
    n_updates: int = 0
    n_deletes: int = 0
    last_commit_lsn: int = 0

    @property
    def n_changes(self) -> int:
        return self.n_inserts + self.n_updates + self.n_deletes


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
    st = collect(
        relation_ids,
        txns,
        schema=schema,
        key_names=key_names,
        proto_version=proto_version,
        streaming=streaming,
        table=table,
    )
    effect = _net(st, partition)
    effect.last_commit_lsn = max(t.commit_lsn for t in txns) if txns else 0
    return effect


def _typed_keys(part: FoldPart, schema: pa.Schema, old: bool) -> list[pa.Array]:
    tuples = part.run.old if old else part.run.new
    layout = part.layout
    cols = convert_columns(
        layout, {layout.names[i]: tuples.values[i] for i in layout.key_idx}, schema
    )
    return [comparable(cols[layout.names[i]]) for i in layout.key_idx]


def _net(st: FoldInput, partition: tuple[int, int] = (0, 1)) -> NetEffect:
    effect = NetEffect(
        st.schema.empty_table(),
        [],
        truncated=st.truncated,
        n_inserts=st.counts[m.TAG_INSERT],
        n_updates=st.counts[m.TAG_UPDATE],
        n_deletes=st.counts[m.TAG_DELETE],
    )
    log, moves = _key_events(st)
    events = log.events()
    if events is None:
        return effect
    if partition[1] > 1:
        events = events.select(_own_events(events, st, moves, partition))
        if events.table.num_rows == 0:
            return effect
    g = events.grouped(nulls_equal=False)
    effect.upserts, effect.fills = _upserts(st, g)
    # Keys that may name a live pre-batch row: first event not an INSERT's put.
    if not st.truncated:
        lookup = g.first & ~(g.put & (g.op == m.TAG_INSERT))
        if lookup.any():
            take = g.order.filter(pa.array(lookup))
            effect.remove_keys = [events.table.column(nm).take(take) for nm in events.names]
    return effect


def _key_events(st: FoldInput) -> tuple[EventLog, list[tuple[int, np.ndarray]]]:
    """The events on keys (see EVENTS), and the key-changing updates as (run, rows)."""
    assert st.key_names is not None
    log = EventLog(len(st.key_names))
    moves: list[tuple[int, np.ndarray]] = []
    for p_i, part in enumerate(st.parts):
        run = part.run
        new_keys = _typed_keys(part, st.schema, old=False)
        if run.has_old.any():
            old_keys = _typed_keys(part, st.schema, old=True)
            moved = _moved(run, new_keys, old_keys)
            if moved.any():
                moves.append((p_i, np.flatnonzero(moved)))
            removes = np.flatnonzero((run.ops == m.TAG_DELETE) | moved)
            log.add(p_i, part, removes, old_keys, put=False)
        log.add(p_i, part, np.flatnonzero(run.ops != m.TAG_DELETE), new_keys, put=True)
    return log, moves


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


def _upserts(st: FoldInput, g: Grouped) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """Rows to write: the last event of a key, when it is a put; with the masks of
    the unchanged TOAST values to take from the pre-batch row (``NetEffect.fills``)."""
    sources = _unchanged_sources(st, g)
    offsets = np.cumsum([0, *(len(p.run.ops) for p in st.parts)])
    fills: dict[str, list[np.ndarray]] = {}

    def raw(p_i: int, part: FoldPart, rows: np.ndarray, at: np.ndarray) -> dict[str, pa.Array]:
        idx = pa.array(rows)
        out = {name: part.run.new.values[i].take(idx) for i, name in enumerate(part.layout.names)}
        for name, (src, combined) in sources.items():
            if name not in out:
                fills.setdefault(name, []).append(np.zeros(len(rows), bool))
                continue
            picked = src[at]  # global source row, -1: pre-batch, -2: not unchanged
            take = np.where(picked >= 0, picked, offsets[p_i] + rows)
            out[name] = combined.take(pa.array(take))
            fills.setdefault(name, []).append(picked == -1)
        return out

    upserts = gather_rows(st, g, g.last & g.put, raw)
    masks = {name: mask for name, parts in fills.items() if (mask := np.concatenate(parts)).any()}
    return upserts, masks


def _unchanged_rows(run: ChangeRun) -> np.ndarray:
    out = np.zeros(len(run.ops), bool)
    for kind in run.new.kinds:
        out |= kind == m.KIND_UNCHANGED
    return out


def _unchanged_sources(st: FoldInput, g: Grouped) -> dict[str, tuple[np.ndarray, pa.Array]]:
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
    events = np.arange(len(glob))
    group_start = np.maximum.accumulate(np.where(g.first, events, 0))
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
        nearest = np.maximum.accumulate(np.where(has_value, events, -1))
        in_group = nearest >= group_start
        src = np.where(unchanged, np.where(in_group, glob[np.maximum(nearest, 0)], -1), -2).astype(
            np.int64
        )
        out[name] = (src, pa.concat_arrays(values))
    return out


def key_hash(keys: Sequence[pa.Array]) -> np.ndarray:
    """A deterministic hash of each row's key (same value, same hash, in any process):
    for one integer column without nulls (the usual key), a mix of the value's bits;
    otherwise a polynomial over the bytes of its canonical encoding."""
    if len(keys) == 1 and pa.types.is_integer(keys[0].type) and keys[0].null_count == 0:
        col = keys[0]
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        x = col.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
        # splitmix64's finalizer: 1,000,000 keys in milliseconds, not in half a second
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
        mixed: np.ndarray = (x >> np.uint64(1)).astype(np.int64)
        return mixed
    canon = canonical_keys(keys)
    if isinstance(canon, pa.ChunkedArray):
        canon = canon.combine_chunks()
    canon = canon.cast(pa.large_binary())
    n = len(canon)
    offsets = np.frombuffer(canon.buffers()[1], np.int64, n + 1, canon.offset * 8)
    buf = canon.buffers()[2]
    data = np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    data = data[offsets[0] : offsets[-1]]
    owner = np.repeat(np.arange(n), lengths)
    pos = np.arange(len(data)) - np.repeat(offsets[:-1] - offsets[0], lengths)
    weights = (data.astype(np.int64) + 1) * ((pos * 7919 + 104729) % 1000003)
    sums = np.bincount(owner, weights=weights.astype(np.float64), minlength=n)
    return sums.astype(np.int64) * 2654435761 % 4294967311 + lengths


def _own_events(
    events: Events,
    st: FoldInput,
    moves: list[tuple[int, np.ndarray]],
    partition: tuple[int, int],
) -> np.ndarray:
    """Which events belong to this task's partition (see MANY TASKS PER TABLE)."""
    index, count = partition
    keys = [events.table.column(nm).combine_chunks() for nm in events.names]
    buckets = key_hash(keys) % count
    if moves:
        import networkx as nx

        canon = canonical_keys(keys).to_pylist()
        graph = nx.Graph()
        for p_i, rows in moves:
            part = st.parts[p_i]
            old = _typed_keys(part, st.schema, old=True)
            new = _typed_keys(part, st.schema, old=False)
            idx = pa.array(rows)
            old_c = canonical_keys([k.take(idx) for k in old]).to_pylist()
            new_c = canonical_keys([k.take(idx) for k in new]).to_pylist()
            graph.add_edges_from(zip(old_c, new_c, strict=True))
        home: dict[bytes, int] = {}
        for component in nx.connected_components(graph):
            first = min(component)
            bucket = int(key_hash([pa.array([first], pa.binary())])[0] % count)
            for key in component:
                home[key] = bucket
        for i, key in enumerate(canon):
            moved_to = home.get(key)
            if moved_to is not None:
                buckets[i] = moved_to
    mine: np.ndarray = buckets == index
    return mine
