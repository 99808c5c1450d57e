"""The row-wise fold of a REPLICA IDENTITY FULL table: rows are a multiset, and an
UPDATE or DELETE changes exactly one row equal to its old image, whether that row came
in the same batch or lives in a pre-batch data file. Checked against a plain model on
seeded random batches full of duplicates."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.apply.effect import apply_delta
from sparkapply.apply.fold import TxnInput, fold_table
from sparkapply.apply.writer import TableWriter
from sparkapply.changes.spool import SpoolWriter
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m
from sparkapply.sink.files import DataFileInfo

REL = m.Relation(
    None,
    7,
    "public",
    "t",
    "f",
    (m.RelationColumn(1, "a", 23, -1), m.RelationColumn(1, "b", 25, -1)),
)
SCHEMA = pa.schema([pa.field("a", pa.int32()), pa.field("b", pa.large_string())])
Image = tuple[int, str | None]


def tup(row: Image) -> m.TupleData:
    a, b = row
    return m.TupleData(
        b"tn" if b is None else b"tt", (str(a).encode(), None if b is None else b.encode())
    )


def random_row(rnd: random.Random) -> Image:
    return rnd.randint(0, 3), rnd.choice(["x", "y", None])  # few values: many duplicates


@pytest.mark.parametrize("seed", range(12))
def test_full_identity_fold_equals_the_multiset_model(seed: int, tmp_path: Path) -> None:
    rnd = random.Random(seed)
    pre = [random_row(rnd) for _ in range(40)]
    pre_path = str(tmp_path / "pre.parquet")
    pq.write_table(pa.Table.from_pylist([{"a": a, "b": b} for a, b in pre], SCHEMA), pre_path)
    state = Counter(pre)
    w = SpoolWriter(tmp_path / "s.spool")
    txns = []
    for t in range(4):
        start = w.offset
        for _ in range(rnd.randint(20, 300)):  # the bigger seeds: more rows than pre-batch
            live = sorted(state.elements(), key=repr)
            op = rnd.random()
            if op < 0.5 or not live:
                row = random_row(rnd)
                state[row] += 1
                w.append(encode(m.Insert(None, 7, tup(row))), False)
            elif op < 0.8:
                old, new = rnd.choice(live), random_row(rnd)
                state[old] -= 1
                state[new] += 1
                w.append(encode(m.Update(None, 7, "O", tup(old), tup(new))), False)
            else:
                old = rnd.choice(live)
                state[old] -= 1
                w.append(encode(m.Delete(None, 7, "O", tup(old))), False)
        w.flush()
        txns.append(TxnInput(t, 100 + t, 1000 + t, (w.segment(start),), (REL,)))

    delta = fold_table(frozenset({7}), False, txns)
    out = apply_delta(
        delta,
        schema=SCHEMA,
        key_names=(),
        data_files=(DataFileInfo(pre_path, len(pre), 0),),
        delete_files=(),
        writer=TableWriter(str(tmp_path / "out"), SCHEMA),
    )
    gone: set[int] = set()
    for d in out.deletes:
        gone |= set(pq.read_table(d.path.removeprefix("file://")).column("pos").to_pylist())
    got = Counter(row for i, row in enumerate(pre) if i not in gone)
    for path in out.added:
        got.update(
            (r["a"], r["b"]) for r in pq.read_table(path.removeprefix("file://")).to_pylist()
        )
    assert got == +state
    # In-batch rows cancelled by a later change are not written, then deleted again.
    assert out.rows_written == len(delta.upserts()) <= sum((+state).values())
