"""The vectorised fold of a REPLICA IDENTITY FULL table's changes: rows are a multiset.

Runs on an executor, for a table without a key: every change carries whole row images
(pgoutput marks every column as part of the identity), and equal rows are
indistinguishable. It runs over the event kernel (``events.py``: decoding, event
numbers, grouping, gathering rows) and says which events a change makes on images
and what an image's events net to. It gives the same result as the row-wise fold in
``rowwise.py`` (the tests run both on the same inputs, and both against a model).

EVENTS
    Every change becomes events on a row *image* (the relation layout and the raw
    text of every column, NULL distinct from any text), numbered in commit order: an
    INSERT or UPDATE *puts* its new image (an UPDATE's unchanged TOAST columns take
    the old image's value, which FULL always sends); an UPDATE or DELETE *removes*
    its old image.

NET EFFECT PER IMAGE
    Walked in order, a remove cancels one pending in-batch put of the same image if
    there is one, else it deletes one live pre-batch row equal to the image. With
    ``S`` the running sum of puts (+1) and removes (-1), the pre-batch rows deleted
    are ``max(0, -min S)`` (each new minimum is a remove that found nothing pending)
    and the rows written are ``S_end`` plus that: computed for all images at once
    over the events sorted by (image, number), no Python loop over rows.

    TRUNCATE empties the table at its position: only the events after the last one
    count (``events.collect`` drops the others), and no pre-batch row needs deleting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.apply.fold import events
from sparkapply.apply.fold.path import NeedsRowFold
from sparkapply.apply.fold.rowwise import Layout, TxnInput
from sparkapply.apply.write.columns import convert_columns
from sparkapply.datafiles import empty_table
from sparkapply.pgoutput import messages as m
from sparkapply.plan.keys import canonical_keys


@dataclass(slots=True)
class RemovedImages:
    """Pre-batch rows to delete, of one relation layout."""

    counts: dict[bytes, int]  # canonical image (over layout_columns) → rows to delete
    # A column and the images' values in it: a live row whose value is not among them
    # cannot match, so only the others are encoded (a FULL table has no key to prune by).
    probe: tuple[str, pa.Array] | None = None

    def add(self, other: RemovedImages) -> None:
        for key, count in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + count
        if self.probe is not None and other.probe is not None:
            name, values = self.probe
            self.probe = (name, pa.concat_arrays([values, other.probe[1]]))


# Types whose ``is_in`` equality is exactly the canonical encoding's (not floats: NaN
# payloads and signed zeros).
_PROBE_TYPES = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_decimal,
    pa.types.is_date,
    pa.types.is_timestamp,
    pa.types.is_time,
)


def _probe_type(t: pa.DataType) -> bool:
    return any(is_type(t) for is_type in _PROBE_TYPES)


def removed_images(
    layout: Layout,
    typed: Mapping[str, pa.Array | pa.ChunkedArray],
    counts: Sequence[int],
    schema: pa.Schema,
) -> RemovedImages:
    """The images (typed columns of ``layout``, one row per image) with their counts."""
    names = layout_columns(layout, schema)
    canon = canonical_keys([typed[n] for n in names]).to_pylist()
    out = RemovedImages({})
    for key, count in zip(canon, counts, strict=True):
        out.counts[key] = out.counts.get(key, 0) + count
    for name in names:
        if _probe_type(schema.field(name).type):
            values = typed[name]
            if isinstance(values, pa.ChunkedArray):
                values = values.combine_chunks()
            out.probe = (name, values)
            break
    return out


@dataclass(slots=True)
class FullEffect(events.Counts):
    """What a batch does to a REPLICA IDENTITY FULL table (typed, in its schema)."""

    upserts: pa.Table  # the rows to write
    # Pre-batch rows to delete, per layout: how many live rows equal to each image go.
    removes: dict[Layout, RemovedImages] = field(default_factory=dict)


def fold_full(
    relation_ids: frozenset[int],
    txns: Sequence[TxnInput],
    *,
    schema: pa.Schema,
    proto_version: int = 4,
    streaming: str = "parallel",
    table: str = "?",
) -> FullEffect:
    """Fold the table's changes of ``txns`` (commit order). Raises
    :class:`NeedsRowFold` when only the row-wise fold can do it."""
    st = events.collect(relation_ids, txns, schema, None, proto_version, streaming, table)
    return events.counted(_net(st), st, txns)


def layout_columns(layout: Layout, schema: pa.Schema) -> list[str]:
    """The columns an image of ``layout`` is compared on: those the table has."""
    return [n for n in layout.names if schema.get_field_index(n) >= 0]


def _filled_new(part: events.FoldPart) -> list[pa.Array]:
    """The new image's raw columns, unchanged TOAST values taken from the old image."""
    run = part.run
    out = []
    for kind, new, old in zip(run.new.kinds, run.new.values, run.old.values, strict=True):
        unchanged = kind == m.KIND_UNCHANGED
        if not unchanged.any():
            out.append(new)
            continue
        if not bool(np.all(run.has_old[unchanged])):
            raise NeedsRowFold("an unchanged TOAST value without the old image")
        out.append(pc.if_else(pa.array(unchanged), old, new))
    return out


def _net(st: events.FoldInput) -> FullEffect:
    effect = FullEffect(empty_table(st.schema))
    if not st.parts:
        return effect
    if len({p.layout for p in st.parts}) > 1:
        # Images of different relation versions: the row-wise fold compares them as
        # it always has (a column added mid-batch is rare on a FULL table).
        raise NeedsRowFold("the relation changed within the batch")
    filled, on_images = _image_events(st)
    if on_images is None:
        return effect
    g = on_images.grouped(nulls_equal=True)
    keep, from_pre = _multiset(g)

    def raw(
        p_i: int, part: events.FoldPart, rows: np.ndarray, at: np.ndarray
    ) -> dict[str, pa.Array]:
        return dict(zip(part.layout.names, events.at_rows(filled[p_i], rows), strict=True))

    effect.upserts = events.gather_rows(st, g, keep, raw)
    if not st.truncated and from_pre.any():
        effect.removes = _removed_images(st, filled, g, from_pre)
    return effect


def _image_events(st: events.FoldInput) -> tuple[list[list[pa.Array]], events.Events | None]:
    """Each run's new images (unchanged TOAST values filled), and the events on
    images (see EVENTS); one relation layout, so images compare column by column."""
    log = events.EventLog(len(st.parts[0].layout.names))
    filled: list[list[pa.Array]] = []
    for p_i, part in enumerate(st.parts):
        run = part.run
        if bool(np.any((run.ops == m.TAG_UPDATE) & ~run.has_old)):
            raise NeedsRowFold("an UPDATE without the old image")
        filled.append(_filled_new(part))
        # A remove (old image) comes before the put (new image) of the same UPDATE.
        log.add(p_i, part, np.flatnonzero(run.has_old), run.old.values, put=False)
        log.add(p_i, part, np.flatnonzero(run.ops != m.TAG_DELETE), filled[-1], put=True)
    return filled, log.events()


def _multiset(g: events.Grouped) -> tuple[np.ndarray, np.ndarray]:
    """Per sorted event, whether it is a row to write; per image, how many pre-batch
    rows it deletes (see NET EFFECT PER IMAGE)."""
    total = len(g.put)
    group = np.cumsum(g.first) - 1
    first = np.flatnonzero(g.first)
    delta = np.where(g.put, 1, -1).astype(np.int64)
    running = np.cumsum(delta)
    before = (running - delta)[first]  # the running sum before each image's first event
    within = running - before[group]
    lowest = np.minimum.reduceat(within, first)
    from_pre = np.maximum(0, -lowest)  # pre-batch rows each image deletes
    last = np.append(first[1:], total) - 1
    written = within[last] + from_pre  # in-batch rows of each image that stay

    # Rows to write: the last ``written`` puts of each image (equal rows: any will do).
    is_put = g.put
    puts_so_far = np.cumsum(is_put)
    puts_before = (puts_so_far - is_put)[first]
    puts_total = puts_so_far[last] - puts_before
    rank_from_end = puts_total[group] - (puts_so_far - puts_before[group])
    keep: np.ndarray = is_put & (rank_from_end < written[group])
    return keep, from_pre


def _removed_images(
    st: events.FoldInput, filled: list[list[pa.Array]], g: events.Grouped, from_pre: np.ndarray
) -> dict[Layout, RemovedImages]:
    """The images of the pre-batch rows to delete, with their counts."""
    groups = np.flatnonzero(from_pre)
    at = np.flatnonzero(g.first)[groups]  # an event of each such image (all are equal)
    parts, rows, old = g.part[at], g.row[at], ~g.put[at]
    counts = from_pre[groups]
    out: dict[Layout, RemovedImages] = {}
    for p_i in np.unique(parts).tolist():
        part = st.parts[p_i]
        sel = parts == p_i
        idx = pa.array(rows[sel])
        is_old = pa.array(old[sel])
        raw = {}
        for i, name in enumerate(part.layout.names):
            o = part.run.old.values[i].take(idx)
            n = filled[p_i][i].take(idx)
            raw[name] = pc.if_else(is_old, o, n)
        typed = convert_columns(part.layout, raw, st.schema)
        images = removed_images(part.layout, typed, counts[sel].tolist(), st.schema)
        if part.layout in out:
            out[part.layout].add(images)
        else:
            out[part.layout] = images
    return out
