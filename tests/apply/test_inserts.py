"""The column-wise insert path gives exactly what the row-wise fold gives."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.apply.fold.append import append_inserts
from sparkapply.apply.fold.rowwise import TxnInput, coalesced, fold_table
from sparkapply.apply.tasks import run_table_task
from sparkapply.apply.write.effect import Target, apply_delta
from sparkapply.apply.write.parquet import TableWriter
from sparkapply.changes.spool import SpoolWriter
from sparkapply.errors import ProtocolError
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m
from tests.apply.test_paths import task as table_task

COLS = (
    m.RelationColumn(1, "id", 20, -1),
    m.RelationColumn(0, "name", 25, -1),
    m.RelationColumn(0, "amount", 1700, ((12 << 16) | 2) + 4),
)
V1 = m.Relation(None, 7, "public", "t", "d", COLS)
V2 = m.Relation(None, 7, "public", "t", "d", (*COLS, m.RelationColumn(0, "extra", 23, -1)))
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.large_string()),
        pa.field("amount", pa.decimal128(12, 2)),
        pa.field("extra", pa.int32()),
    ]
)


def ins(i: int, xid: int | None, extra: bool = False) -> m.Insert:
    name = None if i % 5 == 0 else f"n{i} é\t".encode()
    vals = [str(i).encode(), name, f"{i}.{i % 100:02d}".encode()]
    kinds = b"t" + (b"n" if name is None else b"t") + b"t"
    if extra:
        vals.append(None if i % 2 else str(-i).encode())
        kinds += b"n" if i % 2 else b"t"
    return m.Insert(xid, 7, m.TupleData(kinds, tuple(vals)))


def spool(tmp_path: Path) -> TxnInput:
    w = SpoolWriter(tmp_path / "s.spool")
    other = m.Insert(None, 99, m.TupleData(b"t", (b"x",)))  # another table: skipped
    for i in range(1, 3000):
        w.append(encode(other if i % 97 == 0 else ins(i, None)), False)
    w.append(encode(m.Relation(10, *(getattr(V2, f) for f in V2.__slots__[1:]))), True)
    for i in range(3000, 4000):
        w.append(encode(ins(i, 10 if i % 3 else 11, extra=True)), True)
    w.flush()
    return TxnInput(0, 10, 100, (w.segment(0),), (V1,))


def test_column_wise_equals_row_wise(tmp_path: Path) -> None:
    txn = spool(tmp_path)
    fast, n = append_inserts(
        frozenset({7}), [txn], schema=SCHEMA, writer=TableWriter(str(tmp_path / "a"), SCHEMA)
    )
    delta = fold_table(frozenset({7}), True, [txn])
    slow = apply_delta(
        delta, ("id",), Target(SCHEMA, (), (), TableWriter(str(tmp_path / "b"), SCHEMA))
    )

    def read(paths: list[str]) -> pa.Table:
        tables = [pq.read_table(p.removeprefix("file://")) for p in paths]
        return pa.concat_tables(tables).sort_by("id")

    a, b = read(fast.added), read(slow.added)
    assert n == delta.n_changes == 2999 - 30 + 1000
    assert a.num_rows == n
    assert a.equals(b)
    row = a.filter(pa.compute.equal(a["id"], 3002)).to_pylist()[0]
    assert row["extra"] == -3002 and row["name"] == "n3002 é\t"


def test_a_cut_record_is_a_protocol_error(tmp_path: Path) -> None:
    w = SpoolWriter(tmp_path / "s.spool")
    good = encode(ins(1, None))
    w.append(good[:-3], False)  # the last value's bytes are missing
    w.flush()
    txn = TxnInput(0, 10, 100, (w.segment(0),), (V1,))
    with pytest.raises(ProtocolError, match=r"runs past its record|trailing|cut off") as info:
        append_inserts(
            frozenset({7}), [txn], schema=SCHEMA, writer=TableWriter(str(tmp_path / "a"), SCHEMA)
        )
    assert info.value.context["xid"] == 10


def test_the_task_times_its_phases(tmp_path: Path) -> None:
    task = table_task(
        tmp_path, key_names=("id",), txns=(spool(tmp_path),), schema=SCHEMA, insert_only=True
    )
    result = run_table_task(task)
    assert result.error is None and result.path == "insert-only"
    assert set(result.timings) == {"decode", "write"}
    assert all(0 < seconds < result.seconds for seconds in result.timings.values())


@pytest.mark.parametrize("shipped", [False, True])
def test_an_error_in_a_run_names_the_exact_transaction(tmp_path: Path, shipped: bool) -> None:
    w = SpoolWriter(tmp_path / "s.spool")
    txns = []
    for t in range(3):
        start = w.offset
        good = encode(ins(t + 1, None))
        w.append(good[:-3] if t == 1 else good, False)
        w.flush()
        txns.append(TxnInput(t, 10 + t, 100 + t, (w.segment(start),), (V1,)))
    if shipped:  # the driver coalesced them
        txns = coalesced(txns)
        assert len(txns) == 1
    with pytest.raises(ProtocolError) as info:
        append_inserts(
            frozenset({7}), txns, schema=SCHEMA, writer=TableWriter(str(tmp_path / "a"), SCHEMA)
        )
    assert info.value.context["xid"] == 11
    assert info.value.context["lsn"] == 101
