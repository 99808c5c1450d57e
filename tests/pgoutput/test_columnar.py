"""The column-wise reader agrees with the decoder, and is total on malformed records."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import columnar, encode
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.columnar import (
    ChangeRun,
    ChunkIndex,
    _gather,
    decode_changes,
    stream_decoders,
)

COLUMNS = (m.RelationColumn(1, "id", 23, -1), m.RelationColumn(0, "v", 25, -1))
NAMES = tuple(c.name for c in COLUMNS)
XID = 9


def tup(*values: m.ColumnValue) -> m.TupleData:
    kinds = bytes(
        m.KIND_NULL if v is None else m.KIND_UNCHANGED if v is m.UNCHANGED else m.KIND_TEXT
        for v in values
    )
    return m.TupleData(kinds, values)


@dataclass(frozen=True, slots=True)
class Chunk:
    """What the spool's ``RecordChunk`` holds (columnar.Records)."""

    data: bytes
    starts: list[int]
    lengths: list[int]
    in_stream: list[bool]


def chunk(messages: list[m.Message]) -> Chunk:
    payloads = [encode(msg) for msg in messages]
    starts = np.cumsum([0, *map(len, payloads)])[:-1].tolist()
    in_stream = [getattr(msg, "xid", None) is not None for msg in messages]
    return Chunk(b"".join(payloads), starts, [len(p) for p in payloads], in_stream)


def changes(xid: int | None) -> list[m.Message]:
    return [
        m.Relation(xid, 7, "public", "t", "d", COLUMNS),
        m.Insert(xid, 7, tup(b"1", b"a")),
        m.Update(xid, 7, None, None, tup(b"1", m.UNCHANGED)),
        m.Update(xid, 7, "K", tup(b"1", None), tup(b"2", b"")),
        m.Insert(xid, 8, tup(b"x", None)),  # another table: not in its run
        m.Delete(xid, 7, "O", tup(b"2", b"b")),
        m.Truncate(xid, 0, (7,)),
        m.Insert(xid, 7, tup(None, b"c" * 300)),
    ]


def values(run: ChangeRun, old: bool, row: int) -> tuple[bytes, tuple[m.ColumnValue, ...]]:
    """One row of a decoded run, as the decoder's TupleData would hold it."""
    tuples = run.old if old else run.new
    kinds = bytes(int(k[row]) for k in tuples.kinds)
    vals = tuple(
        m.UNCHANGED if kind == m.KIND_UNCHANGED else v[row].as_py()
        for kind, v in zip(kinds, tuples.values, strict=True)
    )
    return kinds, vals


@pytest.mark.parametrize("xid", [None, XID], ids=["plain", "in-stream"])
def test_another_relations_relation_is_not_a_run_boundary(xid: int | None) -> None:
    """Only the RELATION messages of the task's relations are handed out to be
    decoded: a transaction over 300 tables has 300, and each task is one table's."""
    other = m.Relation(xid, 8, "public", "u", "d", COLUMNS)
    ix = ChunkIndex.of(chunk([other, *changes(xid)[:4], other, *changes(xid)[4:]]))
    runs = [(i, None if rows is None else rows.tolist()) for i, rows in ix.runs(frozenset({7}))]
    assert runs == [(1, None), (-1, [2, 3, 4, 7]), (8, None), (-1, [9])]
    both = [i for i, rows in ix.runs(frozenset({7, 8})) if rows is None]
    assert both == [0, 1, 5, 8]


@pytest.mark.parametrize("xid", [None, XID], ids=["plain", "in-stream"])
def test_runs_and_rows_agree_with_the_decoder(xid: int | None) -> None:
    ix = ChunkIndex.of(chunk(changes(xid)))
    assert list(ix.tags) == [
        m.TAG_RELATION,
        m.TAG_INSERT,
        m.TAG_UPDATE,
        m.TAG_UPDATE,
        m.TAG_INSERT,
        m.TAG_DELETE,
        m.TAG_TRUNCATE,
        m.TAG_INSERT,
    ]
    runs = [(i, None if rows is None else rows.tolist()) for i, rows in ix.runs(frozenset({7}))]
    assert runs == [(0, None), (-1, [1, 2, 3, 5]), (6, None), (-1, [7])]
    decoders = stream_decoders(4, "parallel")
    for _, rows in ix.runs(frozenset({7})):
        if rows is None:
            continue
        run = decode_changes(ix.b, ix.starts[rows], ix.ends[rows], ix.in_stream[rows], 7, NAMES)
        assert run.relation_id == 7 and run.ops.tolist() == ix.tags[rows].tolist()
        for j, i in enumerate(rows.tolist()):
            msg = decoders[bool(ix.in_stream[i])].decode(ix.payload(i))
            assert isinstance(msg, m.Insert | m.Update | m.Delete)
            if isinstance(msg, m.Delete):
                assert values(run, False, j) == (b"nn", (None, None))
            else:
                assert values(run, False, j) == (msg.new.kinds, msg.new.values)
            expected_old = None if isinstance(msg, m.Insert) else msg.old
            assert bool(run.has_old[j]) == (expected_old is not None)
            if expected_old is not None:
                assert values(run, True, j) == (expected_old.kinds, expected_old.values)


def test_unchanged_toast_is_seen() -> None:
    ix = ChunkIndex.of(chunk(changes(None)))
    rows = np.array([1, 2])
    run = decode_changes(ix.b, ix.starts[rows], ix.ends[rows], ix.in_stream[rows], 7, NAMES)
    assert run.new.has_unchanged() and not run.old.has_unchanged()


def _one(msg: m.Message, cut: int = 0, extra: bytes = b"") -> ChunkIndex:
    wire = encode(msg)
    wire = (wire[:-cut] if cut else wire) + extra
    return ChunkIndex.of(Chunk(wire, [0], [len(wire)], [False]))


@pytest.mark.parametrize(
    ("ix", "names", "match"),
    [
        (_one(m.Insert(None, 7, tup(b"1", b"abc")), cut=1), NAMES, "runs past its record"),
        (_one(m.Insert(None, 7, tup(b"1", b"abc")), extra=b"x"), NAMES, "trailing bytes"),
        (_one(m.Insert(None, 7, tup(b"1", None)), cut=1), NAMES, "ends before column 'v'"),
        (_one(m.Insert(None, 7, tup(b"1"))), NAMES, "column count differs"),
        (_one(m.Delete(None, 7, "K", tup(b"1", None)), cut=1), NAMES, "ends before column"),
        (_one(m.Insert(None, 7, m.TupleData(b"tb", (b"1", b"\x00")))), NAMES, "kind"),
    ],
    ids=["value cut", "trailing", "kind cut", "natts", "delete cut", "binary kind"],
)
def test_malformed_records_raise_protocol_error(
    ix: ChunkIndex, names: tuple[str, ...], match: str
) -> None:
    rows = np.array([0])
    with pytest.raises(ProtocolError, match=match):
        decode_changes(ix.b, ix.starts[rows], ix.ends[rows], ix.in_stream[rows], 7, names)


def test_a_change_too_short_for_its_relation_id_raises() -> None:
    with pytest.raises(ProtocolError, match="too short for its relation id"):
        ChunkIndex.of(Chunk(bytes([m.TAG_INSERT, 0, 0]), [0], [3], [False]))


WIDE = tuple(m.RelationColumn(0, f"c{i}", 25, -1) for i in range(7))


def _column_values(rnd: np.random.Generator, shape: str, n: int) -> list[m.ColumnValue]:
    """Values of one column: every value of one width (``char(n)``, uuids), the
    gather's strided path, or of several, its indexed ones; with nulls, unchanged
    TOAST and empty strings among them."""
    if shape == "fixed":
        out: list[m.ColumnValue] = [bytes(rnd.integers(97, 123, 84, np.uint8)) for _ in range(n)]
    elif shape == "fixed-with-gaps":
        out = [bytes(rnd.integers(48, 58, 36, np.uint8)) for _ in range(n)]
        for i in rnd.choice(n, n // 3, replace=False).tolist():
            out[i] = None if i % 2 else m.UNCHANGED
    elif shape == "short":
        out = [str(int(v)).encode() for v in rnd.integers(0, 10**6, n)]
    elif shape == "long":
        out = [bytes(rnd.integers(97, 123, int(w), np.uint8)) for w in rnd.integers(16, 200, n)]
    elif shape == "empty":
        out = [b""] * n
    else:  # "mixed": empty, short, long, null
        out = [
            None if w < 0 else bytes(rnd.integers(97, 123, int(w), np.uint8))
            for w in rnd.integers(-3, 300, n)
        ]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_values_of_every_width_read_as_the_decoder_reads_them(seed: int) -> None:
    rnd = np.random.default_rng(seed)
    n = int(rnd.integers(1, 400))
    shapes = ["fixed", "fixed-with-gaps", "short", "long", "empty", "mixed", "fixed"]
    rnd.shuffle(shapes)
    columns = [_column_values(rnd, shape, n) for shape in shapes]
    rows = [tup(*(c[i] for c in columns)) for i in range(n)]
    messages: list[m.Message] = [m.Relation(None, 7, "public", "w", "d", WIDE)]
    messages += [
        m.Insert(None, 7, r) if i % 2 else m.Update(None, 7, "O", rows[i - 1], r)
        for i, r in enumerate(rows)
    ]
    ix = ChunkIndex.of(chunk(messages))
    ((_, sel),) = [(i, r) for i, r in ix.runs(frozenset({7})) if r is not None]
    names = tuple(c.name for c in WIDE)
    run = decode_changes(ix.b, ix.starts[sel], ix.ends[sel], ix.in_stream[sel], 7, names)
    for j, msg in enumerate(messages[1:]):
        assert isinstance(msg, m.Insert | m.Update)
        assert values(run, False, j) == (msg.new.kinds, msg.new.values)
        if isinstance(msg, m.Update):
            assert msg.old is not None
            assert values(run, True, j) == (msg.old.kinds, msg.old.values)


@pytest.mark.parametrize("seed", range(6))
def test_a_gather_takes_each_value_whatever_its_length_and_place(seed: int) -> None:
    """Values of several lengths, some ending at the buffer's last byte (a row of the
    masked path that would run past it), some absent: each path of the gather gives
    the values back to back, as slicing them one by one does."""
    rnd = np.random.default_rng(seed)
    n = int(rnd.integers(1, 300))
    lo, hi = [(0, 3), (1, 8), (5, 12), (60, 100), (1, 2000)][seed % 5]
    ln = rnd.integers(lo, hi, n).astype(np.int64)
    isval = rnd.random(n) < (0.7 if seed % 2 else 1.0)
    ln[~isval] = 0
    gaps = rnd.integers(0, 3, n)
    start = np.cumsum(gaps + np.concatenate([[0], ln[:-1]])).astype(np.int64)
    b = rnd.integers(0, 256, int(start[-1] + ln[-1]), dtype=np.uint8)  # the last ends at the end
    expected = b"".join(bytes(b[s : s + w]) for s, w, v in zip(start, ln, isval, strict=True) if v)
    assert bytes(_gather(b, start, ln, isval)) == expected


@pytest.mark.parametrize("lazy", [True, False], ids=["kept-places", "gathered"])
def test_values_read_the_same_whole_at_rows_and_spread(
    lazy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoded column is the same gathered whole, gathered at some rows only, or
    spread over a run of mixed changes, whether its values' places were kept
    (``columnar.Values``) or it was gathered as it was decoded (a big run)."""
    if not lazy:
        monkeypatch.setattr(columnar, "LAZY_VALUES", 0)
    rng = np.random.default_rng(18)
    msgs: list[m.Message] = []
    expected: list[bytes | None] = []  # the new tuples' second column (none for a DELETE)
    for i in range(200):
        text = None if i % 7 == 0 else b"v" * int(rng.integers(0, 40))
        row = tup(str(i).encode(), text)
        deleted = i % 5 == 0
        msgs.append(m.Delete(None, 7, "K", row) if deleted else m.Insert(None, 7, row))
        expected.append(None if deleted else text)
    ix = ChunkIndex.of(chunk(msgs))
    everything = np.arange(len(msgs))
    run = decode_changes(ix.b, ix.starts, ix.ends, ix.in_stream, 7, NAMES)
    rows = np.flatnonzero(rng.random(len(msgs)) < 0.1)
    picked = run.new.values.at_rows(rows)  # before any column is gathered whole
    assert picked[1].to_pylist() == [expected[r] for r in rows.tolist()]
    assert run.new.values[1].to_pylist() == expected  # spread: deletes have no new tuple
    assert run.new.values.at_rows(rows)[1].to_pylist() == [expected[r] for r in rows.tolist()]
    assert run.new.values.at_rows(everything)[0].to_pylist() == [
        None if isinstance(msg, m.Delete) else str(i).encode() for i, msg in enumerate(msgs)
    ]
