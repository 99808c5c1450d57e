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

from sparkapply.apply.fold.path import NeedsRowFold
from sparkapply.apply.fold.rowwise import Layout, TxnInput, coalesced, uncoalesced
from sparkapply.apply.write.columns import convert_columns, fit_table
from sparkapply.apply.write.keys import canonical_keys, comparable
from sparkapply.changes.spool import read_chunks
from sparkapply.errors import ApplyError, SparkapplyError
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.columnar import ChangeRun, ChunkIndex, decode_changes, stream_decoders


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


@dataclass(slots=True)
class FoldPart:
    """One decoded run of change records of one relation layout."""

    run: ChangeRun
    layout: Layout
    base: int  # event number of its first record


@dataclass(slots=True)
class FoldInput:
    """A table's change runs of a batch, decoded, in commit order (after the last
    TRUNCATE, if any)."""

    schema: pa.Schema
    key_names: tuple[str, ...] | None  # None: any layout (REPLICA IDENTITY FULL)
    parts: list[FoldPart] = field(default_factory=list)
    seq: int = 0
    truncated: bool = False
    counts: dict[int, int] = field(
        default_factory=lambda: {m.TAG_INSERT: 0, m.TAG_UPDATE: 0, m.TAG_DELETE: 0}
    )


def collect(
    relation_ids: frozenset[int],
    txns: Sequence[TxnInput],
    *,
    schema: pa.Schema,
    key_names: tuple[str, ...] | None,
    proto_version: int = 4,
    streaming: str = "parallel",
    table: str = "?",
) -> FoldInput:
    """Decode the table's changes of ``txns``. Raises :class:`NeedsRowFold` if a
    layout's key columns are not ``key_names``; an error names its exact transaction."""
    groups = coalesced(txns)
    while True:
        st = FoldInput(schema, key_names)
        for group in groups:
            try:
                _txn(st, relation_ids, group, proto_version, streaming)
            except SparkapplyError as exc:
                if group.members > 1:  # decode again, one transaction at a time
                    break
                raise exc.with_context(xid=group.xid, lsn=group.commit_lsn, table=table) from None
        else:
            return st
        groups = uncoalesced(txns)


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


def _txn(
    st: FoldInput, relation_ids: frozenset[int], txn: TxnInput, proto_version: int, streaming: str
) -> None:
    layouts = {r.relation_id: Layout.of(r) for r in txn.relations}
    decoders = stream_decoders(proto_version, streaming)
    for seg in txn.segments:
        for chunk in read_chunks(seg):
            ix = ChunkIndex.of(chunk)
            for i, rows in ix.runs(relation_ids):
                if rows is None:
                    msg = decoders[bool(ix.in_stream[i])].decode(ix.payload(i))
                    if isinstance(msg, m.Relation):
                        layouts[msg.relation_id] = Layout.of(msg)
                    elif isinstance(msg, m.Truncate) and relation_ids.intersection(
                        msg.relation_ids
                    ):
                        st.parts.clear()
                        st.truncated = True
                    continue
                for rid in np.unique(ix.relids[rows]).tolist():
                    sel = rows[ix.relids[rows] == rid]
                    layout = layouts.get(rid)
                    if layout is None:
                        raise ApplyError(
                            f"change for relation id {rid} before its RELATION message"
                        )
                    keys = tuple(layout.names[i] for i in layout.key_idx)
                    if st.key_names is not None and keys != st.key_names:
                        raise NeedsRowFold("the key columns differ between relation versions")
                    run = decode_changes(
                        ix.b, ix.starts[sel], ix.ends[sel], ix.in_stream[sel], rid, layout.names
                    )
                    for op in st.counts:
                        st.counts[op] += int(np.count_nonzero(run.ops == op))
                    st.parts.append(FoldPart(run, layout, st.seq))
                    st.seq += len(sel)


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
    if not st.parts:
        return effect
    # Events: (key columns..., number, put?, first-is-insert?, part, row)
    assert st.key_names is not None
    key_cols: list[list[pa.Array]] = [[] for _ in st.key_names]
    numbers, puts, inserts, part_ix, row_ix = [], [], [], [], []
    moves: list[tuple[int, np.ndarray]] = []  # (part, rows) of key-changing updates
    for p_i, part in enumerate(st.parts):
        run = part.run
        n = len(run.ops)
        ops = run.ops
        seq = (part.base + np.arange(n, dtype=np.int64)) * 2
        new_keys = _typed_keys(part, st.schema, old=False)
        old_keys = _typed_keys(part, st.schema, old=True) if run.has_old.any() else None
        put_rows = np.flatnonzero(ops != m.TAG_DELETE)
        # A remove event for every DELETE and every UPDATE whose old key differs.
        if old_keys is not None:
            moved = run.has_old & (ops == m.TAG_UPDATE)
            if moved.any():
                differs = np.zeros(n, bool)
                for new_c, old_c in zip(new_keys, old_keys, strict=True):
                    ne = pc.fill_null(pc.not_equal(new_c, old_c), False)
                    differs |= ne.to_numpy(zero_copy_only=False)
                moved &= differs
                if moved.any() and _unchanged_rows(run)[moved].any():
                    raise NeedsRowFold("a key-changing update sends unchanged TOAST values")
                if moved.any():
                    moves.append((p_i, np.flatnonzero(moved)))
            rm_rows = np.flatnonzero((ops == m.TAG_DELETE) | moved)
        else:
            rm_rows = np.zeros(0, np.int64)
        for rows, keys, put in ((rm_rows, old_keys, False), (put_rows, new_keys, True)):
            if len(rows) == 0 or keys is None:
                continue
            idx = pa.array(rows)
            for c, k in zip(key_cols, keys, strict=True):
                c.append(k.take(idx))
            numbers.append(seq[rows] + (1 if put else 0))
            puts.append(np.full(len(rows), put))
            inserts.append(ops[rows] == m.TAG_INSERT if put else np.zeros(len(rows), bool))
            part_ix.append(np.full(len(rows), p_i, np.int32))
            row_ix.append(rows)
    if not numbers:
        return effect
    names = [f"k{i}" for i in range(len(st.key_names))]
    events = pa.table(
        {
            **{name: pa.concat_arrays(c) for name, c in zip(names, key_cols, strict=True)},
            "n": np.concatenate(numbers),
        }
    )
    if partition[1] > 1:
        mine = _own_events(events, names, st, moves, partition)
        mask = pa.array(mine)
        events = events.filter(mask)
        numbers = [np.concatenate(numbers)[mine]]
        puts = [np.concatenate(puts)[mine]]
        inserts = [np.concatenate(inserts)[mine]]
        row_ix = [np.concatenate(row_ix)[mine]]
        part_ix = [np.concatenate(part_ix)[mine]]
        if events.num_rows == 0:
            return effect
    order = pc.sort_indices(events, [*((nm, "ascending") for nm in names), ("n", "ascending")])
    order_np = order.to_numpy()
    total = len(order_np)
    boundary = np.zeros(max(total - 1, 0), bool)
    for nm in names:
        col = events.column(nm).take(order)
        if total > 1:
            ne = pc.not_equal(col.slice(1), col.slice(0, total - 1))
            boundary |= pc.fill_null(ne, True).to_numpy(zero_copy_only=False)
    last = np.append(boundary, True)
    first = np.insert(boundary, 0, True)

    put_all = np.concatenate(puts)[order_np]
    ins_all = np.concatenate(inserts)[order_np]
    part_all = np.concatenate(part_ix)[order_np]
    row_all = np.concatenate(row_ix)[order_np]

    # Rows to write: the last event of a key, when it is a put.
    keep = last & put_all
    sources = _unchanged_sources(st, first, put_all, part_all, row_all)
    offsets = np.cumsum([0, *(len(p.run.ops) for p in st.parts)])
    pieces = []
    fills: dict[str, list[np.ndarray]] = {}
    for p_i, part in enumerate(st.parts):
        sel = keep & (part_all == p_i)
        by_row = np.argsort(row_all[sel], kind="stable")
        rows = row_all[sel][by_row]
        if len(rows) == 0:
            continue
        idx = pa.array(rows)
        layout = part.layout
        raw = {name: part.run.new.values[i].take(idx) for i, name in enumerate(layout.names)}
        for name, (src, combined) in sources.items():
            if name not in raw:
                continue
            own = offsets[p_i] + rows
            picked = src[sel][by_row]  # global source row, -1: pre-batch, -2: not unchanged
            take = np.where(picked >= 0, picked, own)
            raw[name] = combined.take(pa.array(take))
            fills.setdefault(name, []).append(picked == -1)
        cols = convert_columns(layout, raw, st.schema)
        pieces.append(fit_table(cols, len(rows), st.schema))
        for name in sources:
            if name not in raw:
                fills.setdefault(name, []).append(np.zeros(len(rows), bool))
    if pieces:
        effect.upserts = pa.concat_tables(pieces)
    effect.fills = {
        name: mask for name, parts in fills.items() if (mask := np.concatenate(parts)).any()
    }
    # Keys that may name a live pre-batch row: first event not an INSERT's put.
    if not st.truncated:
        lookup = first & ~ins_all
        if lookup.any():
            take = order.filter(pa.array(lookup))
            effect.remove_keys = [events.column(nm).take(take) for nm in names]
    return effect


def _unchanged_rows(run: ChangeRun) -> np.ndarray:
    out = np.zeros(len(run.ops), bool)
    for kind in run.new.kinds:
        out |= kind == m.KIND_UNCHANGED
    return out


def _unchanged_sources(
    st: FoldInput,
    first: np.ndarray,
    put_all: np.ndarray,
    part_all: np.ndarray,
    row_all: np.ndarray,
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
    glob = offsets[part_all] + row_all
    events = np.arange(len(glob))
    group_start = np.maximum.accumulate(np.where(first, events, 0))
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
        unchanged = put_all & (kinds[glob] == m.KIND_UNCHANGED)
        has_value = put_all & ~unchanged
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
    events: pa.Table,
    names: list[str],
    st: FoldInput,
    moves: list[tuple[int, np.ndarray]],
    partition: tuple[int, int],
) -> np.ndarray:
    """Which events belong to this task's partition (see MANY TASKS PER TABLE)."""
    index, count = partition
    keys = [events.column(nm).combine_chunks() for nm in names]
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
