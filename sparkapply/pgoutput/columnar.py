"""Column-wise reading of change records (INSERT, UPDATE, DELETE) with numpy; no I/O.

Owns the vectorised half of the pgoutput reader: where :class:`~sparkapply.pgoutput.Decoder`
turns one message into one object, this module reads a run of change records of one
relation layout without a Python object per row or per value. Each tuple's kinds,
lengths and value bytes sit at positions numpy computes for all rows at once, and each
column's value bytes are gathered into one Arrow binary array (PostgreSQL text) that
:func:`~sparkapply.convert.values.to_arrow` converts. Every position is checked against
its record's bounds before bytes are gathered, so a malformed record raises
:class:`ProtocolError`, never an IndexError. The records come from the spool
(``changes/spool.py``'s ``RecordChunk``, seen here as :class:`Records`); the apply's
executors use this module (``apply/fold/append.py``, ``apply/fold/events.py``).

Record layouts (after the tag, the xid inside a stream block, and the relation id):
``I``: ``'N'`` tuple; ``U``: [``'K'``|``'O'`` tuple] ``'N'`` tuple; ``D``: ``'K'``|``'O'``
tuple. A tuple is ``int16 natts`` then per column a kind byte (``n`` null, ``u``
unchanged TOAST, ``t`` text + ``int32`` length + bytes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

import numpy as np
import pyarrow as pa
from numpy.lib.stride_tricks import sliding_window_view

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput.decoder import Decoder
from sparkapply.pgoutput.messages import (
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED,
    TAG_DELETE,
    TAG_INSERT,
    TAG_RELATION,
    TAG_TRUNCATE,
    TAG_UPDATE,
    TUPLE_KEY,
    TUPLE_NEW,
    TUPLE_OLD,
)


class Records(Protocol):
    """A run of whole records held in one buffer, with their index (the spool's
    ``RecordChunk``): record i's payload is ``data[starts[i]:starts[i] + lengths[i]]``,
    received inside a stream block if ``in_stream[i]``."""

    @property
    def data(self) -> bytes: ...

    @property
    def starts(self) -> Sequence[int] | np.ndarray: ...

    @property
    def lengths(self) -> Sequence[int] | np.ndarray: ...

    @property
    def in_stream(self) -> Sequence[bool] | np.ndarray: ...


def be32(b: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian uint32 at each of ``pos``: read through a view of ``b`` with a
    4-byte value at every byte, so the gather moves 4 bytes a value, not four 8-byte
    indexes and their bytes (a tenth of staging a piece of a million-row update went
    to reading lengths: 1,000,000 of them in 13 against 36 ms)."""
    b = np.ascontiguousarray(b)
    every = np.ndarray(shape=(max(len(b) - 3, 0),), dtype=">u4", buffer=b, strides=(1,))
    out: np.ndarray = every[pos].astype(np.int64)
    return out


def _gather(b: np.ndarray, start: np.ndarray, ln: np.ndarray, isval: np.ndarray) -> np.ndarray:
    """The bytes ``start[i]`` to ``start[i] + ln[i]`` of ``b``, for the rows ``isval``
    (the others have ``ln`` 0), back to back; every range is inside ``b``.

    One index per byte is what a gather of variable-length values costs, and it was a
    third of a pgbench batch folded on the driver: ``char(84)`` fillers, 7 MB of
    value bytes in a batch of 20,000 transactions, moved as 110 MB of indexes. Values
    of one length (``char(n)``, uuids, timestamps, dates, keys of one number of
    digits) are copied as rows of a strided view, with no index per byte (80,000
    values of 84 bytes: 0.9 against 26 ms). Values of several lengths, none much
    longer than their mean (numbers, statuses, md5s), are copied the same way at the
    longest one's width, then the bytes past each value's end are masked out: twice
    as fast as an index per byte (170,000 values of 5 to 12 bytes: 0.95 against
    1.84 ms; of 60 to 100: 3.2 against 6.8 ms). Others take 32-bit indexes, half the
    traffic of 64-bit ones (80,000 of 60 to 100 bytes: 15 against 22 ms), unless
    they are short."""
    lengths = ln[isval]
    if not len(lengths):
        return b[:0]
    width = int(lengths[0])
    if width and bool(np.all(lengths == width)):
        rows: np.ndarray = sliding_window_view(b, width)[start[isval]]
        return rows.reshape(-1)
    total = int(lengths.sum())
    longest = int(lengths.max())
    if longest * len(lengths) <= 4 * total:
        return _gather_masked(b, start[isval], lengths, longest)
    small = len(b) < 1 << 31 and total >= 16 * len(lengths)
    kind = np.int32 if small else np.int64
    offsets = np.zeros(len(ln), kind)
    np.cumsum(ln[:-1], out=offsets[1:])
    idx = np.repeat((start - offsets).astype(kind), ln)
    idx += np.arange(total, dtype=kind)
    gathered: np.ndarray = b[idx]
    return gathered


def _gather_masked(b: np.ndarray, start: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """:func:`_gather` through rows of ``width`` bytes from each start, masked to each
    value's length; a row that would run past ``b`` (a value near its end) is copied
    alone, zero-padded."""
    inside = start + width <= len(b)
    if bool(inside.all()):
        rows: np.ndarray = sliding_window_view(b, width)[start]
    else:
        rows = np.zeros((len(start), width), np.uint8)
        rows[inside] = sliding_window_view(b, width)[start[inside]]
        for i in np.flatnonzero(~inside).tolist():
            tail = b[int(start[i]) :]
            rows[i, : len(tail)] = tail
    kept: np.ndarray = rows[np.arange(width) < lengths[:, None]]
    return kept


def malformed(what: str, tag: str = "?") -> ProtocolError:
    return ProtocolError(f"malformed change record in the spool: {what}", tag=tag)


# Decoded tuples keep each value's place instead of its bytes only while they hold at
# most this many values (positions take 17 bytes a value until gathered), and only
# when their records are at least an eighth of the buffer they keep alive (a table's
# few changes in each chunk of a big batch of other tables' would keep every chunk).
LAZY_VALUES = 250_000
LAZY_SHARE = 8


class Values(Sequence[pa.Array]):
    """Decoded tuples' raw text, column by column. A column is gathered from the
    records' buffer when it is first asked for: whole (``values[i]``), or at some
    rows only (:meth:`at_rows`). A keyed fold keeps one row per key: of a hot table's
    thousands of updates (pgbench's tellers and branches) it writes a handful, and
    gathering every column of every row first was most of its decoding."""

    __slots__ = ("_b", "_columns")

    def __init__(self, b: np.ndarray, columns: list[pa.Array | _Places]) -> None:
        self._b = b
        self._columns = columns  # per column: gathered, or where its values are

    def __len__(self) -> int:
        return len(self._columns)

    @overload
    def __getitem__(self, i: int) -> pa.Array: ...

    @overload
    def __getitem__(self, i: slice) -> list[pa.Array]: ...

    def __getitem__(self, i: int | slice) -> pa.Array | list[pa.Array]:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        column = self._columns[i]
        if isinstance(column, _Places):
            column = self._columns[i] = column.gather(self._b)
        return column

    def at_rows(self, rows: np.ndarray) -> list[pa.Array]:
        """Every column at ``rows`` (ascending, distinct): a column not gathered
        whole yet is gathered at those rows only."""
        out = []
        kept: pa.Array | None = None  # a filter: several times faster than a take
        for i, column in enumerate(self._columns):
            if isinstance(column, _Places):
                if len(rows) < len(column.starts):
                    out.append(column.at(rows).gather(self._b))
                    continue
                column = self[i]
            if len(rows) == len(column):
                out.append(column)
                continue
            if kept is None:
                mask = np.zeros(len(column), bool)
                mask[rows] = True
                kept = pa.array(mask)
            out.append(column.filter(kept))
        return out

    def spread(self, rows: np.ndarray, n: int) -> Values:
        """These values as rows ``rows`` of ``n`` rows, null elsewhere."""
        target = np.full(n, -1, np.int64)
        target[rows] = np.arange(len(rows))
        take = pa.array(target, mask=target < 0)
        return Values(
            self._b,
            [c.spread(rows, n) if isinstance(c, _Places) else c.take(take) for c in self._columns],
        )


@dataclass(frozen=True, slots=True)
class _Places:
    """Where one column's values are in the buffer: each row's start and length, and
    whether it has a value ('t'; else it is null)."""

    starts: np.ndarray
    lengths: np.ndarray
    isval: np.ndarray

    def gather(self, b: np.ndarray) -> pa.Array:
        return _text_column(b, self.starts, self.lengths, self.isval)

    def at(self, rows: np.ndarray) -> _Places:
        return _Places(self.starts[rows], self.lengths[rows], self.isval[rows])

    def spread(self, rows: np.ndarray, n: int) -> _Places:
        starts, lengths, isval = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
        starts[rows], lengths[rows], isval[rows] = self.starts, self.lengths, self.isval
        return _Places(starts, lengths, isval)


def _text_column(b: np.ndarray, vstart: np.ndarray, ln: np.ndarray, isval: np.ndarray) -> pa.Array:
    """One column's raw text: the values of ``ln`` bytes at ``vstart`` (null where not
    ``isval``), as one Arrow binary array."""
    offsets = np.zeros(len(ln) + 1, np.int64)
    np.cumsum(ln, out=offsets[1:])
    validity = None if bool(isval.all()) else pa.array(isval).buffers()[1]
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(ln),
        [validity, pa.py_buffer(offsets), pa.py_buffer(_gather(b, vstart, ln, isval))],
    )


@dataclass(slots=True)
class Tuples:
    """One tuple per row: per column, the kind bytes and the raw text (null unless 't')."""

    kinds: list[np.ndarray]
    values: Values
    ends: np.ndarray  # position after each tuple

    def has_unchanged(self) -> bool:
        return any(bool(np.any(k == KIND_UNCHANGED)) for k in self.kinds)


def decode_tuples(
    b: np.ndarray, pos: np.ndarray, ends: np.ndarray, names: Sequence[str], tag: str
) -> Tuples:
    """Decode the tuples that start at ``pos`` (their ``int16 natts``)."""
    if np.any(pos + 2 > ends):
        raise malformed("tuple header is cut off", tag)
    natts = (b[pos].astype(np.int64) << 8) | b[pos + 1].astype(np.int64)
    if np.any(natts != len(names)):
        raise malformed(f"column count differs from the RELATION ({len(names)})", tag)
    pos = pos + 2
    kinds: list[np.ndarray] = []
    columns: list[pa.Array | _Places] = []
    lazy = len(pos) * len(names) <= LAZY_VALUES and LAZY_SHARE * int((ends - pos).sum()) >= len(b)
    for name in names:
        if np.any(pos >= ends):
            raise malformed(f"tuple ends before column {name!r}", tag)
        kind = b[pos]
        isval = kind == KIND_TEXT
        known = isval | (kind == KIND_NULL) | (kind == KIND_UNCHANGED)
        if not bool(np.all(known)):
            bad = sorted({chr(int(k)) for k in kind[~known]})
            raise malformed(f"column {name!r} has kind(s) {bad} (expected t, n or u)", tag)
        vpos = np.where(isval, pos + 1, pos)
        if np.any(isval & (vpos + 4 > ends)):
            raise malformed(f"length of column {name!r} is cut off", tag)
        ln = np.where(isval, be32(b, np.where(isval, vpos, 0)), 0)
        if np.any(ln >= 1 << 31) or np.any(isval & (vpos + 4 + ln > ends)):
            raise malformed(f"value of column {name!r} runs past its record", tag)
        vstart = vpos + 4
        places = _Places(vstart, ln, isval)
        columns.append(places if lazy else places.gather(b))
        kinds.append(kind)
        pos = np.where(isval, vstart + ln, pos + 1)
    return Tuples(kinds, Values(b, columns), pos)


@dataclass(slots=True)
class ChangeRun:
    """Change records of one relation (one layout), in record order.

    ``new`` holds the new tuple of INSERT/UPDATE rows (DELETE rows have nulls there,
    and kind ``n``); ``old`` the old tuple of UPDATEs that sent one and of DELETEs
    (``has_old`` says which rows); for the other rows it is null.
    """

    relation_id: int
    ops: np.ndarray  # uint8 message tags: TAG_INSERT / TAG_UPDATE / TAG_DELETE
    new: Tuples
    old: Tuples
    has_old: np.ndarray


def _scatter(part: Tuples, rows: np.ndarray, n: int) -> Tuples:
    """Spread tuples decoded for ``rows`` to ``n`` rows (nulls elsewhere); columns
    not gathered yet stay so."""
    if len(rows) == n:
        return part
    kinds = []
    for k in part.kinds:
        full = np.full(n, KIND_NULL, np.uint8)
        full[rows] = k
        kinds.append(full)
    ends = np.zeros(n, np.int64)
    ends[rows] = part.ends
    return Tuples(kinds, part.values.spread(rows, n), ends)


def decode_changes(
    b: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    in_stream: np.ndarray,
    relation_id: int,
    names: Sequence[str],
) -> ChangeRun:
    """Decode change records of one relation layout (any mix of I, U and D)."""
    ops = b[starts]
    pos = starts + 1 + np.where(in_stream, 4, 0) + 4  # tag, [xid], relid
    if np.any(pos + 1 > ends):
        raise malformed("record ends after its relation id")
    marker = b[pos]
    is_i, is_u, is_d = ops == TAG_INSERT, ops == TAG_UPDATE, ops == TAG_DELETE
    has_old = (is_u | is_d) & ((marker == TUPLE_KEY) | (marker == TUPLE_OLD))
    if np.any(is_d & ~has_old):
        raise malformed("DELETE without an old tuple ('K' or 'O')", "D")
    n = len(starts)
    old_rows = np.flatnonzero(has_old)
    old = decode_tuples(b, pos[old_rows] + 1, ends[old_rows], names, "U/D")
    new_pos = pos.copy()
    new_pos[old_rows] = old.ends
    new_rows = np.flatnonzero(is_i | is_u)
    if np.any(new_pos[new_rows] + 1 > ends[new_rows]) or np.any(b[new_pos[new_rows]] != TUPLE_NEW):
        raise malformed("no new tuple ('N') where one must be", "I/U")
    new = decode_tuples(b, new_pos[new_rows] + 1, ends[new_rows], names, "I/U")
    d_ends = old.ends[is_d[old_rows]]
    if np.any(new.ends != ends[new_rows]) or np.any(d_ends != ends[is_d & has_old]):
        raise malformed("trailing bytes after the tuple")
    return ChangeRun(
        relation_id, ops, _scatter(new, new_rows, n), _scatter(old, old_rows, n), has_old
    )


@dataclass(slots=True)
class ChunkIndex:
    """A spool chunk's records as numpy arrays, with each change record's relation id."""

    b: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    in_stream: np.ndarray
    tags: np.ndarray
    relids: np.ndarray  # -1 for records that are not changes
    described: np.ndarray  # a RELATION record's relation id; -1 for others (or too short)
    chunk: Records

    @classmethod
    def of(cls, chunk: Records) -> ChunkIndex:
        b = np.frombuffer(chunk.data, np.uint8)
        starts = np.asarray(chunk.starts, np.int64)
        ends = starts + np.asarray(chunk.lengths, np.int64)
        in_stream = np.asarray(chunk.in_stream, bool)
        if np.any(ends - starts < 1):
            raise ProtocolError("empty message in the spool")
        tags = b[starts]
        is_change = (tags == TAG_INSERT) | (tags == TAG_UPDATE) | (tags == TAG_DELETE)
        relpos = starts + 1 + np.where(in_stream, 4, 0)
        if np.any(is_change & (relpos + 4 > ends)):
            raise ProtocolError("change message too short for its relation id")
        relids = np.where(is_change, be32(b, np.where(is_change, relpos, 0)), -1)
        readable = (tags == TAG_RELATION) & (relpos + 4 <= ends)
        described = np.full(len(tags), -1, np.int64)
        described[readable] = be32(b, relpos[readable])
        return cls(b, starts, ends, in_stream, tags, relids, described, chunk)

    def payload(self, i: int) -> bytes:
        start = self.chunk.starts[i]
        return self.chunk.data[start : start + self.chunk.lengths[i]]

    def runs(self, relation_ids: frozenset[int]) -> Iterator[tuple[int, np.ndarray | None]]:
        """Alternate runs of this table's change records (``(-1, rows)``) with the
        RELATION (of one of ``relation_ids``) or TRUNCATE record that separates them
        (``(i, None)``), in order.

        Another relation's RELATION is left out, unread: a transaction that touches
        300 tables carries 300 of them, and each of its 300 tasks decoding them all
        (a wide table's of 1,000 columns among them) took seconds. One too short to
        hold a relation id is kept, so that its decode raises."""
        ids = np.fromiter(relation_ids, np.int64, len(relation_ids))
        mine = np.isin(self.relids, ids)
        ours = (self.tags == TAG_RELATION) & ((self.described < 0) | np.isin(self.described, ids))
        special = np.flatnonzero(ours | (self.tags == TAG_TRUNCATE))
        run_start = 0
        for i in [*special.tolist(), len(self.tags)]:
            sel = np.flatnonzero(mine[run_start:i]) + run_start
            if len(sel):
                yield -1, sel
            if i < len(self.tags):
                yield i, None
            run_start = i + 1


def stream_decoders(proto_version: int, streaming: str) -> dict[bool, Decoder]:
    """Decoders for records received outside and inside a stream block."""
    plain = Decoder(proto_version=proto_version, streaming=streaming)
    if proto_version < 2:
        return {False: plain, True: plain}
    return {
        False: plain,
        True: Decoder(proto_version=proto_version, streaming=streaming, in_stream=True),
    }
