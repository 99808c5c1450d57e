"""Fold one table's changes of a batch, in commit order, into their net effect.

Runs on an executor. Input: the spool segments of the batch's transactions that
touch the table. Output: a :class:`TableDelta` saying which pre-batch rows must go and
which rows must be written, with values still in PostgreSQL text form. It reads every
change as a row, so it takes what the vectorised folds (``keyed``, ``full``, over the
event kernel of ``events.py``) cannot net: they raise ``NeedsRowFold`` (``path.py``).

ROW SEMANTICS
    Keyed tables (a primary key or REPLICA IDENTITY USING INDEX): the state maps a key
    (the key columns' text) to the row's last image or to "deleted". An update whose
    old key differs moves the row: the old key is deleted. A column sent as unchanged
    TOAST (``u``) takes the value of the same column in the row the update read: the
    in-batch image if there is one, else the pre-batch row in the table, found later
    by ``source_key``.

    REPLICA IDENTITY FULL tables have no key: rows are a multiset. A delete removes
    exactly one row equal to the old image; an update is such a delete plus an insert
    whose unchanged columns come from the old image (which is complete for FULL).
    In-batch inserts are cancelled first, then pre-batch rows.

    TRUNCATE empties the table at its position: everything before it is forgotten and
    every pre-batch row goes.

    MIXED IDENTITIES: a transaction that changes the table's replica identity between
    two of its changes (a migration that writes, moves the key, writes again) sends
    changes of both identities in one batch. Each change is applied by the identity
    of the relation version it came with, as PostgreSQL's subscriber does: in-batch
    rows are one list, found by image (FULL) or by the key columns of the change
    (an index per key built when first asked for); pre-batch rows are removed by key,
    grouped by key columns, or by image. A table without an identity receives only
    inserts (the publisher refuses its updates and deletes); an UPDATE or DELETE for
    one stops the apply naming the transaction.

    Rows carry the relation layout (column names) they were decoded with, so a column
    added or dropped mid-transaction maps by name into the table's current schema.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from sparkapply.changes.spool import SpoolSegment, read_records
from sparkapply.errors import ApplyError, SparkapplyError
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.columnar import stream_decoders
from sparkapply.pgoutput.peek import peek_change

# Unchanged TOAST is the codec's explicit value (pgoutput/messages.py).
_Unchanged = m.Unchanged
Value = m.ColumnValue
Key = tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """Column names and types of one relation version."""

    names: tuple[str, ...]
    type_oids: tuple[int, ...]
    type_modifiers: tuple[int, ...]
    key_idx: tuple[int, ...]
    full: bool = False  # REPLICA IDENTITY FULL: every column flagged, rows by image

    @classmethod
    def of(cls, rel: m.Relation) -> Layout:
        return cls(
            tuple(c.name for c in rel.columns),
            tuple(c.type_oid for c in rel.columns),
            tuple(c.type_modifier for c in rel.columns),
            tuple(i for i, c in enumerate(rel.columns) if c.is_key),
            rel.replica_identity == "f",
        )

    @property
    def key_names(self) -> tuple[str, ...]:
        """The key columns a change of this version names its row by; () for FULL
        and for no identity."""
        return () if self.full else tuple(self.names[i] for i in self.key_idx)


@dataclass(slots=True)
class Row:
    layout: Layout
    values: list[Value]
    source_key: Key | None = None  # pre-batch key to fill UNCHANGED values from
    source_names: tuple[str, ...] = ()  # its key columns (mixed identities only)


@dataclass(frozen=True, slots=True)
class TxnInput:
    """One transaction's share of a table task (picklable), or a run of transactions
    read as one (see :func:`coalesced`)."""

    ordinal: int
    xid: int
    commit_lsn: int
    segments: tuple[SpoolSegment, ...]
    relations: tuple[m.Relation, ...]  # cache entries as of its start
    members: int = 1  # transactions read as one (see coalesced)
    # A run's members (``members > 1``), each as (ordinal, xid, commit LSN, offset
    # where its records start in the run's one segment): to split it again.
    parts: tuple[Part, ...] = ()

    def __reduce__(self) -> tuple[object, ...]:
        # A batch of 20,000 one-row transactions that cannot be coalesced is 20,000
        # of these in a task: the dataclass default (a state dict built from
        # fields()) pickles 4x slower, and SpoolSegment likewise.
        segs = tuple((s.path, s.start, s.end) for s in self.segments)
        state = (self.ordinal, self.xid, self.commit_lsn, segs, self.relations)
        return (_txn_input, (*state, self.members, self.parts))


Part = tuple[int, int, int, int]


def _txn_input(
    ordinal: int,
    xid: int,
    commit_lsn: int,
    segs: tuple[tuple[str, int, int], ...],
    relations: tuple[m.Relation, ...],
    members: int,
    parts: tuple[Part, ...],
) -> TxnInput:
    segments = tuple(SpoolSegment(p, a, b) for p, a, b in segs)
    return TxnInput(ordinal, xid, commit_lsn, segments, relations, members, parts)


def coalesced(txns: Sequence[TxnInput]) -> list[TxnInput]:
    """Runs of ordinary transactions read as one: small transactions received one
    after another sit back to back in one spool file, and reading them in one pass
    costs one file read and one set of vector operations instead of one per
    transaction (20,000 single-row updates). The joining rule is :class:`Runs`'s.
    Coalescing coalesced inputs again gives the same runs (the driver coalesces
    before it ships a task: one object per run crosses to the executor instead of
    one per transaction)."""
    runs = Runs()
    for t in txns:
        runs.add(t)
    return runs.inputs()


class Runs:
    """A table's transactions, in commit order, joined into runs as they are added.

    THE RULE
        A transaction joins the run before it when both are one spool segment, it
        starts in the same file where the run ends, and it starts with the same
        relation cache, so the RELATION messages in the spool, replayed in place,
        give every change its layout. A run carries its first ordinal and xid, its
        greatest commit LSN and its members (``parts``); a caller that reports an
        error re-reads :func:`uncoalesced` to name the exact transaction.

    The planner adds each transaction's share as plain values (:meth:`add_one`): a
    batch of 20,000 pgbench transactions on 4 tables is 80,000 shares, and making an
    input object of each only to join them cost most of the batch's planning."""

    __slots__ = ("_end", "_lsn", "_out", "_parts", "_path", "_relations")

    def __init__(self) -> None:
        self._out: list[TxnInput] = []
        self._parts: list[Part] = []  # the open run's members
        self._path = ""
        self._end = -1
        self._relations: tuple[m.Relation, ...] = ()
        self._lsn = 0

    def add_one(
        self,
        ordinal: int,
        xid: int,
        commit_lsn: int,
        segments: tuple[SpoolSegment, ...],
        relations: tuple[m.Relation, ...],
    ) -> None:
        """One transaction's share."""
        if len(segments) != 1:
            self._close()
            self._out.append(TxnInput(ordinal, xid, commit_lsn, segments, relations))
            return
        seg = segments[0]
        self._join(seg, relations)
        self._parts.append((ordinal, xid, commit_lsn, seg.start))
        self._end = seg.end
        if commit_lsn > self._lsn:
            self._lsn = commit_lsn

    def add(self, t: TxnInput) -> None:
        """An input: one transaction's, or a run already joined."""
        if t.members == 1:
            self.add_one(t.ordinal, t.xid, t.commit_lsn, t.segments, t.relations)
            return
        seg = t.segments[0]
        self._join(seg, t.relations)
        self._parts += t.parts
        self._end = seg.end
        self._lsn = max(self._lsn, t.commit_lsn)

    def _join(self, seg: SpoolSegment, relations: tuple[m.Relation, ...]) -> None:
        """Close the open run unless ``seg`` continues it (THE RULE)."""
        if not (
            self._parts
            and seg.start == self._end
            and seg.path == self._path
            and relations == self._relations
        ):
            self._close()
            self._path, self._relations = seg.path, relations

    def inputs(self) -> list[TxnInput]:
        """The runs (and transactions that could not join one), in order."""
        self._close()
        return self._out

    def _close(self) -> None:
        parts = self._parts
        if not parts:
            return
        first = parts[0]
        seg = SpoolSegment(self._path, first[3], self._end)
        if len(parts) == 1:
            self._out.append(TxnInput(first[0], first[1], first[2], (seg,), self._relations))
        else:
            self._out.append(
                TxnInput(
                    first[0],
                    first[1],
                    self._lsn,
                    (seg,),
                    self._relations,
                    len(parts),
                    tuple(parts),
                )
            )
        self._parts = []
        self._lsn = 0


def uncoalesced(txns: Sequence[TxnInput]) -> list[TxnInput]:
    """One input per transaction again (the inverse of :func:`coalesced`)."""
    out: list[TxnInput] = []
    for t in txns:
        if t.members == 1:
            out.append(t)
            continue
        seg = t.segments[0]
        ends = [p[3] for p in t.parts[1:]] + [seg.end]
        for (ordinal, xid, lsn, start), end in zip(t.parts, ends, strict=True):
            out.append(
                TxnInput(ordinal, xid, lsn, (SpoolSegment(seg.path, start, end),), t.relations)
            )
    return out


@dataclass(slots=True)
class TableDelta:
    keyed: bool
    mixed: bool = False  # changes of several identities (see MIXED IDENTITIES)
    truncated: bool = False
    # keyed mode
    rows: dict[Key, Row | None] = field(default_factory=dict)  # None = deleted
    # Pre-batch keys whose rows must be removed (deleted, moved or replaced), with the
    # layout their text was read with (key types can change mid-batch).
    remove_keys: dict[Key, Layout] = field(default_factory=dict)
    # full mode: rows to add (None: cancelled by a later UPDATE or DELETE) and pre-batch
    # rows to remove (by full image); ``pending`` finds an in-batch row by its image,
    # so that each UPDATE or DELETE costs O(1), not a scan of the batch's inserts.
    inserts: list[Row | None] = field(default_factory=list)
    pending: dict[tuple[Layout, tuple[Value, ...]], list[int]] = field(default_factory=dict)
    removes: Counter[tuple[Layout, Key]] = field(default_factory=Counter)
    # mixed mode: in-batch rows by key (per key columns), pre-batch keys to remove
    by_key: dict[tuple[str, ...], dict[Key, int]] = field(default_factory=dict)
    remove_by: dict[tuple[str, ...], dict[Key, Layout]] = field(default_factory=dict)
    n_changes: int = 0
    only_inserts: bool = True
    last_commit_lsn: int = 0

    def upserts(self) -> list[Row]:
        if self.keyed and not self.mixed:
            return [r for r in self.rows.values() if r is not None]
        return [r for r in self.inserts if r is not None]

    def add_row(self, row: Row) -> None:
        """Full and mixed mode: an in-batch row."""
        slot = len(self.inserts)
        self.pending.setdefault(_image(row.layout, row.values), []).append(slot)
        self.inserts.append(row)
        for names, index in self.by_key.items():
            key = _key_by_names(row, names)
            if key is not None:
                index[key] = slot

    def slot_of(self, names: tuple[str, ...], key: Key) -> int | None:
        """Mixed mode: the live in-batch row whose ``names`` columns hold ``key``."""
        index = self.by_key.get(names)
        if index is None:
            index = self.by_key[names] = {}
            for slot, row in enumerate(self.inserts):
                row_key = None if row is None else _key_by_names(row, names)
                if row_key is not None:
                    index[row_key] = slot
        found = index.get(key)
        return found if found is not None and self.inserts[found] is not None else None


def _image(layout: Layout, values: Sequence[Value]) -> tuple[Layout, tuple[Value, ...]]:
    """A row image as FULL compares it: the values by column name, whatever the
    identity flags of the version that sent it."""
    return replace(layout, key_idx=(), full=False), tuple(values)


def _key_by_names(row: Row, names: tuple[str, ...]) -> Key | None:
    at = row.layout.names
    if not all(n in at for n in names):
        return None
    return tuple(row.values[at.index(n)] for n in names)  # type: ignore[misc]


def _values(t: m.TupleData) -> list[Value]:
    return list(t.values)


def fold_table(
    relation_ids: frozenset[int],
    keyed: bool,
    txns: Sequence[TxnInput],
    *,
    proto_version: int = 4,
    streaming: str = "parallel",
    table: str = "?",
    mixed: bool = False,
) -> TableDelta:
    delta = TableDelta(keyed=keyed, mixed=mixed)
    for txn in uncoalesced(txns):  # an error names its exact transaction
        try:
            _fold_txn(delta, relation_ids, txn, proto_version, streaming)
        except SparkapplyError as exc:
            raise exc.with_context(xid=txn.xid, lsn=txn.commit_lsn, table=table) from None
        delta.last_commit_lsn = max(delta.last_commit_lsn, txn.commit_lsn)
    return delta


def _records(txn: TxnInput) -> Iterable[tuple[bytes, bool]]:
    for seg in txn.segments:
        yield from read_records(seg)


def _fold_txn(
    delta: TableDelta,
    relation_ids: frozenset[int],
    txn: TxnInput,
    proto_version: int,
    streaming: str,
) -> None:
    rels = {r.relation_id: r for r in txn.relations}
    layouts = {rid: Layout.of(r) for rid, r in rels.items()}
    decoders = stream_decoders(proto_version, streaming)
    plain, streamed = decoders[False], decoders[True]
    for payload, in_stream in _records(txn):
        tag = payload[0]
        dec = streamed if in_stream else plain
        if tag == m.TAG_RELATION:
            rel = dec.decode(payload)
            assert isinstance(rel, m.Relation)
            rels[rel.relation_id] = rel
            layouts[rel.relation_id] = Layout.of(rel)
            continue
        if tag == m.TAG_TRUNCATE:
            msg = dec.decode(payload)
            assert isinstance(msg, m.Truncate)
            if relation_ids.intersection(msg.relation_ids):
                delta.truncated = True
                delta.only_inserts = False
                delta.rows.clear()
                delta.remove_keys.clear()
                delta.inserts.clear()
                delta.pending.clear()
                delta.removes.clear()
            continue
        if tag not in (m.TAG_INSERT, m.TAG_UPDATE, m.TAG_DELETE):
            if tag != m.TAG_TYPE:
                dec.decode(payload)  # validates; nothing else to apply
            continue
        _, _, relid = peek_change(payload, in_stream)
        if relid not in relation_ids:
            continue
        layout = layouts.get(relid)
        if layout is None:
            raise ApplyError(f"change for relation id {relid} before its RELATION message")
        msg = dec.decode(payload)
        delta.n_changes += 1
        if not layout.full and not layout.key_idx and not isinstance(msg, m.Insert):
            raise ApplyError(
                f"{type(msg).__name__.upper()} for a table without replica identity "
                "(the publisher should have refused it)",
                hint="give the table a primary key or REPLICA IDENTITY FULL on the "
                "publisher, then resync it: sparkapply resync --table <table>",
            )
        if delta.mixed:
            _apply_mixed(delta, layout, msg)
        elif delta.keyed:
            _apply_keyed(delta, layout, msg)
        else:
            _apply_full(delta, layout, msg)


def _key(layout: Layout, values: Sequence[Value]) -> Key:
    key = tuple(values[i] for i in layout.key_idx)
    for v in key:
        if isinstance(v, _Unchanged):
            raise ApplyError("a replica identity column was sent as unchanged TOAST")
    return key  # type: ignore[return-value]


def _apply_keyed(delta: TableDelta, layout: Layout, msg: m.Message) -> None:
    if isinstance(msg, m.Insert):
        values = _values(msg.new)
        key = _key(layout, values)
        if delta.only_inserts:
            # Fast path bookkeeping: pure inserts never need the pre-batch table.
            delta.rows[key] = Row(layout, values)
            return
        delta.rows[key] = Row(layout, values)
        delta.remove_keys[key] = layout  # harmless if absent; exact if a stale row exists
        return
    if delta.only_inserts:
        delta.only_inserts = False
        for key, row in delta.rows.items():
            if row is not None:
                delta.remove_keys[key] = row.layout
    if isinstance(msg, m.Update):
        new_values = _values(msg.new)
        new_key = _key(layout, new_values)
        old_key = _key(layout, _values(msg.old)) if msg.old is not None else new_key
        prev = delta.rows.get(old_key, _MISSING)
        source_key: Key | None = None
        if any(isinstance(v, _Unchanged) for v in new_values):
            if isinstance(prev, Row):
                prev_by_name = dict(zip(prev.layout.names, prev.values, strict=True))
                for i, v in enumerate(new_values):
                    if isinstance(v, _Unchanged):
                        new_values[i] = prev_by_name.get(layout.names[i])
                source_key = prev.source_key
            elif prev is _MISSING:
                source_key = old_key  # read it from the pre-batch row
        if old_key != new_key:
            delta.rows[old_key] = None
            delta.remove_keys.setdefault(old_key, layout)
        delta.rows[new_key] = Row(layout, new_values, source_key)
        delta.remove_keys.setdefault(new_key, layout)
    elif isinstance(msg, m.Delete):
        key = _key(layout, _values(msg.old))
        delta.rows[key] = None
        delta.remove_keys.setdefault(key, layout)


_MISSING = object()


def _full_image(layout: Layout, values: Sequence[Value]) -> tuple[Layout, Key]:
    return layout, tuple(None if isinstance(v, _Unchanged) else v for v in values)


def _remove_one(delta: TableDelta, layout: Layout, old: Sequence[Value]) -> None:
    # Equal rows are indistinguishable: cancelling any in-batch one is the same.
    slots = delta.pending.get(_image(layout, old))
    while slots:
        slot = slots.pop()
        if delta.inserts[slot] is not None:  # (mixed mode may have cancelled it by key)
            delta.inserts[slot] = None
            return
    delta.removes[_full_image(layout, old)] += 1


def _apply_full(delta: TableDelta, layout: Layout, msg: m.Message) -> None:
    if isinstance(msg, m.Insert):
        delta.add_row(Row(layout, _values(msg.new)))
        return
    delta.only_inserts = False
    if isinstance(msg, m.Update):
        new_values = _values(msg.new)
        if msg.old is not None:
            old_values = _values(msg.old)
            for i, v in enumerate(new_values):
                if isinstance(v, _Unchanged):
                    new_values[i] = old_values[i]
            _remove_one(delta, layout, old_values)
        delta.add_row(Row(layout, new_values))
    elif isinstance(msg, m.Delete):
        _remove_one(delta, layout, _values(msg.old))


def _apply_mixed(delta: TableDelta, layout: Layout, msg: m.Message) -> None:
    """One change by the identity of its own relation version (MIXED IDENTITIES)."""
    if layout.full or isinstance(msg, m.Insert):
        _apply_full(delta, layout, msg)
        return
    delta.only_inserts = False
    names = layout.key_names
    if isinstance(msg, m.Delete):
        _take_by_key(delta, names, _key(layout, _values(msg.old)), layout)
        return
    assert isinstance(msg, m.Update)
    new_values = _values(msg.new)
    new_key = _key(layout, new_values)
    old_key = _key(layout, _values(msg.old)) if msg.old is not None else new_key
    prev = _take_by_key(delta, names, old_key, layout)
    row = Row(layout, new_values)
    if any(isinstance(v, _Unchanged) for v in new_values):
        if prev is not None:
            by_name = dict(zip(prev.layout.names, prev.values, strict=True))
            for i, v in enumerate(new_values):
                if isinstance(v, _Unchanged):
                    new_values[i] = by_name.get(layout.names[i])
            row.source_key, row.source_names = prev.source_key, prev.source_names
        else:
            row.source_key, row.source_names = old_key, names
    delta.add_row(row)


def _take_by_key(delta: TableDelta, names: tuple[str, ...], key: Key, layout: Layout) -> Row | None:
    """Cancel the in-batch row with ``key`` and return it; without one, the
    pre-batch row with that key is to be removed."""
    slot = delta.slot_of(names, key)
    if slot is None:
        delta.remove_by.setdefault(names, {}).setdefault(key, layout)
        return None
    row = delta.inserts[slot]
    delta.inserts[slot] = None
    return row
