"""The folds of a REPLICA IDENTITY FULL table, vectorised and row-wise: rows are a
multiset, and an UPDATE or DELETE changes exactly one row equal to its old image,
whether that row came in the same batch or lives in a pre-batch data file. Both are
checked against a plain model on seeded random batches full of duplicates, with
unchanged TOAST values and TRUNCATE."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.apply.fold.full import fold_full
from sparkapply.apply.fold.path import NeedsRowFold
from sparkapply.apply.fold.rowwise import TxnInput, fold_table
from sparkapply.apply.write.effect import Target, WriteResult, apply_delta, write_full_effect
from sparkapply.apply.write.parquet import TableWriter
from sparkapply.changes.spool import SpoolWriter
from sparkapply.datafiles import DataFileInfo
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m

REL = m.Relation(
    None,
    7,
    "public",
    "t",
    "f",
    (m.RelationColumn(1, "a", 23, -1), m.RelationColumn(1, "b", 25, -1)),
)
SCHEMA = pa.schema([pa.field("a", pa.int32()), pa.field("b", pa.large_string())])
Image = tuple[int | None, str | None]


def tup(row: Image, unchanged_b: bool = False) -> m.TupleData:
    a, b = row
    kinds = b"n" if a is None else b"t"
    first = None if a is None else str(a).encode()
    if unchanged_b:  # unchanged TOAST: the old image has the value
        return m.TupleData(kinds + b"u", (first, m.UNCHANGED))
    if b is None:
        return m.TupleData(kinds + b"n", (first, None))
    return m.TupleData(kinds + b"t", (first, b.encode()))


def random_row(rnd: random.Random) -> Image:
    # Few values, so many duplicates; NULLs in both columns (the first is the one live
    # rows are probed by before their images are compared).
    return rnd.choice([0, 1, 2, 3, None]), rnd.choice(["x", "y", None])


def workload(
    rnd: random.Random, tmp_path: Path, pre: list[Image], truncate: bool
) -> tuple[list[TxnInput], Counter[Image], bool]:
    state = Counter(pre)
    truncated = False
    w = SpoolWriter(tmp_path / "s.spool")
    txns = []
    for t in range(4):
        start = w.offset
        for _ in range(rnd.randint(20, 300)):  # some seeds: more rows than pre-batch
            live = sorted(state.elements(), key=repr)
            op = rnd.random()
            if truncate and op < 0.01:
                w.append(encode(m.Truncate(None, 0, (7,))), False)
                state.clear()
                truncated = True
            elif op < 0.5 or not live:
                row = random_row(rnd)
                state[row] += 1
                w.append(encode(m.Insert(None, 7, tup(row))), False)
            elif op < 0.8:
                old, new = rnd.choice(live), random_row(rnd)
                keep_b = rnd.random() < 0.3
                if keep_b:
                    new = (new[0], old[1])
                state[old] -= 1
                state[new] += 1
                w.append(encode(m.Update(None, 7, "O", tup(old), tup(new, keep_b))), False)
            else:
                old = rnd.choice(live)
                state[old] -= 1
                w.append(encode(m.Delete(None, 7, "O", tup(old))), False)
        w.flush()
        txns.append(TxnInput(t, 100 + t, 1000 + t, (w.segment(start),), (REL,)))
    return txns, +state, truncated


def table_after(
    pre_path: str, pre: list[Image], out: WriteResult, truncated: bool
) -> Counter[Image]:
    # A TRUNCATE drops the pre-batch files at commit (the driver's part), not by deletes.
    gone: set[int] = set(range(len(pre))) if truncated else set()
    for d in out.deletes:
        gone |= set(pq.read_table(d.path.removeprefix("file://")).column("pos").to_pylist())
    got = Counter(row for i, row in enumerate(pre) if i not in gone)
    for path in out.added:
        rows = pq.read_table(path.removeprefix("file://")).to_pylist()
        got.update((r["a"], r["b"]) for r in rows)
    return got


@pytest.mark.parametrize("seed", range(16))
def test_both_full_identity_folds_equal_the_multiset_model(seed: int, tmp_path: Path) -> None:
    rnd = random.Random(seed)
    pre = [random_row(rnd) for _ in range(40)]
    pre_path = str(tmp_path / "pre.parquet")
    pq.write_table(pa.Table.from_pylist([{"a": a, "b": b} for a, b in pre], SCHEMA), pre_path)
    txns, want, truncated = workload(rnd, tmp_path, pre, truncate=seed % 4 == 3)
    files = (DataFileInfo(pre_path, len(pre), 0),)

    delta = fold_table(frozenset({7}), False, txns)
    slow = apply_delta(
        delta, (), Target(SCHEMA, files, (), TableWriter(str(tmp_path / "slow"), SCHEMA))
    )
    effect = fold_full(frozenset({7}), txns, schema=SCHEMA)
    fast = write_full_effect(
        effect, Target(SCHEMA, files, (), TableWriter(str(tmp_path / "fast"), SCHEMA))
    )
    assert table_after(pre_path, pre, slow, delta.truncated) == want
    assert table_after(pre_path, pre, fast, effect.truncated) == want
    assert effect.truncated == delta.truncated == truncated
    assert effect.n_changes == delta.n_changes
    # Rows cancelled within the batch are neither written nor deleted again.
    assert fast.rows_written == slow.rows_written == len(delta.upserts())
    assert fast.rows_removed == slow.rows_removed
    if not effect.truncated:
        assert fast.rows_written <= sum(want.values())


def test_a_relation_change_within_the_batch_is_left_to_the_row_wise_fold(
    tmp_path: Path,
) -> None:
    wider = m.Relation(
        None, 7, "public", "t", "f", (*REL.columns, m.RelationColumn(1, "c", 23, -1))
    )
    w = SpoolWriter(tmp_path / "s.spool")
    w.append(encode(m.Insert(None, 7, tup((1, "x")))), False)
    w.append(encode(wider), False)
    w.append(encode(m.Insert(None, 7, m.TupleData(b"ttn", (b"2", b"y", None)))), False)
    w.flush()
    txn = TxnInput(1, 100, 1000, (w.segment(0),), (REL,))
    with pytest.raises(NeedsRowFold):
        fold_full(frozenset({7}), [txn], schema=SCHEMA)
