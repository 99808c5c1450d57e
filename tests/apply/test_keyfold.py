"""The vectorised keyed fold and the row-wise fold give the same table, and both equal a
plain model of the changes, on seeded random batches (inserts, updates, key changes,
deletes, TRUNCATE, a column added mid-batch) applied on top of a pre-batch data file
with merge-on-read deletes."""

from __future__ import annotations

import pickle
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.apply.fold.keyed import fold_keyed
from sparkapply.apply.fold.path import NeedsRowFold
from sparkapply.apply.fold.rowwise import Runs, TxnInput, coalesced, fold_table, uncoalesced
from sparkapply.apply.write.effect import Target, apply_delta, write_effect
from sparkapply.apply.write.parquet import TableWriter
from sparkapply.changes.spool import SpoolSegment, SpoolWriter
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m

COLS = (
    m.RelationColumn(1, "id", 20, -1),
    m.RelationColumn(0, "name", 25, -1),
    m.RelationColumn(0, "qty", 23, -1),
)
V1 = m.Relation(None, 7, "public", "t", "d", COLS)
V2 = m.Relation(None, 7, "public", "t", "d", (*COLS, m.RelationColumn(0, "extra", 23, -1)))
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.large_string()),
        pa.field("qty", pa.int32()),
        pa.field("extra", pa.int32()),
    ]
)
Row = dict[str, object]


def tup(row: Row, width: int, unchanged: frozenset[str] = frozenset()) -> m.TupleData:
    vals: list[m.ColumnValue] = []
    kinds = b""
    for name in ("id", "name", "qty", "extra")[:width]:
        v = row.get(name)
        if name in unchanged:  # unchanged TOAST: no value sent
            vals.append(m.UNCHANGED)
            kinds += b"u"
            continue
        vals.append(None if v is None else str(v).encode())
        kinds += b"n" if v is None else b"t"
    return m.TupleData(kinds, tuple(vals))


def key_tup(key: int, width: int) -> m.TupleData:
    return m.TupleData(b"t" + b"n" * (width - 1), (str(key).encode(), *([None] * (width - 1))))


def workload(
    seed: int, tmp_path: Path, prebatch: dict[int, Row], toast: bool = False
) -> tuple[list[TxnInput], dict[int, Row], bool]:
    """Random transactions over the table; returns them, the expected final rows and
    whether a TRUNCATE happened."""
    rnd = random.Random(seed)
    state = {k: dict(v) for k, v in prebatch.items()}
    w = SpoolWriter(tmp_path / f"s{seed}.spool")
    txns: list[TxnInput] = []
    width = 3
    truncated = False
    next_key = 1000
    for t in range(rnd.randint(3, 8)):
        start = w.offset
        rels = (V2 if width == 4 else V1,)
        for _ in range(rnd.randint(1, 40)):
            op = rnd.random()
            if op < 0.02 and t > 0:
                w.append(encode(m.Truncate(None, 0, (7,))), False)
                state.clear()
                truncated = True
            elif op < 0.04 and width == 3:
                width = 4
                w.append(encode(V2), False)
            elif op < 0.3 or not state:
                next_key += rnd.randint(1, 3)
                row: Row = {"id": next_key, "name": f"n{next_key} ü", "qty": rnd.randint(0, 9)}
                if width == 4:
                    row["extra"] = rnd.choice([None, rnd.randint(-5, 5)])
                state[next_key] = row
                w.append(encode(m.Insert(None, 7, tup(row, width))), False)
            elif op < 0.6:
                key = rnd.choice(sorted(state))
                keep_name = toast and rnd.random() < 0.5
                row = {**state[key], "qty": rnd.randint(10, 99)}
                if not keep_name:
                    row["name"] = rnd.choice([None, "x", f"y{t}"])
                if width == 4:
                    row["extra"] = rnd.randint(0, 3)
                else:
                    row.pop("extra", None)
                state[key] = row
                sent = tup(row, width, frozenset({"name"}) if keep_name else frozenset())
                w.append(encode(m.Update(None, 7, None, None, sent)), False)
            elif op < 0.75:
                old = rnd.choice(sorted(state))
                new = rnd.choice([k for k in range(1, 2000) if k not in state])
                row = {**state.pop(old), "id": new}
                if width == 3:
                    row.pop("extra", None)
                state[new] = row
                w.append(
                    encode(m.Update(None, 7, "K", key_tup(old, width), tup(row, width))), False
                )
            else:
                key = rnd.choice(sorted(state))
                del state[key]
                w.append(encode(m.Delete(None, 7, "K", key_tup(key, width))), False)
        w.flush()
        txns.append(TxnInput(t, 100 + t, 1000 + t, (w.segment(start),), rels))
    return txns, state, truncated


def prebatch_file(tmp_path: Path, rows: dict[int, Row]) -> tuple[str, np.ndarray]:
    """A pre-batch data file holding stale versions (already deleted) and live rows."""
    ordered = []
    for k in sorted(rows):
        ordered.append({**rows[k], "qty": -1, "name": "stale"})  # deleted below
        ordered.append(rows[k])
    table = pa.Table.from_pylist([{**r, "extra": r.get("extra")} for r in ordered], SCHEMA)
    path = str(tmp_path / "pre.parquet")
    pq.write_table(table, path)
    return path, np.arange(0, len(ordered), 2)


def result_rows(
    tmp_path: Path, pre_path: str, pre_deleted: np.ndarray, added: list[str], deletes: list[str]
) -> dict[int, Row]:
    gone = set(pre_deleted.tolist())
    for d in deletes:
        t = pq.read_table(d.removeprefix("file://"))
        assert t.schema.field("file_path").metadata[b"PARQUET:field_id"] == b"2147483546"
        assert t.column("pos").to_pylist() == sorted(t.column("pos").to_pylist())
        assert set(t.column("file_path").to_pylist()) <= {pre_path}
        gone |= set(t.column("pos").to_pylist())
    pre = pq.read_table(pre_path).to_pylist()
    rows = [r for i, r in enumerate(pre) if i not in gone]
    for a in added:
        rows += pq.read_table(a.removeprefix("file://")).to_pylist()
    out: dict[int, Row] = {}
    for r in rows:
        assert r["id"] not in out, f"key {r['id']} is live twice"
        out[r["id"]] = r
    return out


def target(
    directory: Path, data_files: Sequence[DataFileInfo], deletes: Sequence[DeleteFileInfo] = ()
) -> Target:
    """Where a fold's effect on the table of ``SCHEMA`` is written."""
    return Target(SCHEMA, data_files, deletes, TableWriter(str(directory), SCHEMA))


def expected_rows(state: dict[int, Row]) -> dict[int, Row]:
    return {
        k: {"id": k, "name": v.get("name"), "qty": v.get("qty"), "extra": v.get("extra")}
        for k, v in state.items()
    }


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_and_row_wise_folds_agree_with_the_model(seed: int, tmp_path: Path) -> None:
    toast = seed % 2 == 1  # odd seeds send unchanged TOAST values for "name"
    rnd = random.Random(seed * 7919)
    prebatch: dict[int, Row] = {
        k: {"id": k, "name": f"pre {k}", "qty": k % 7}
        for k in sorted(rnd.sample(range(1, 300), 60))
    }
    txns, state, truncated = workload(seed, tmp_path, prebatch, toast)
    if seed % 2 == 0:  # as the driver ships them: coalesced, pickled
        txns = pickle.loads(pickle.dumps(tuple(coalesced(txns))))
    pre_path, pre_deleted = prebatch_file(tmp_path, prebatch)
    # The pre-batch file's stale rows are deleted by an existing delete file.
    setup = TableWriter(str(tmp_path / "setup"), SCHEMA)
    old_deletes = setup.write_deletes({pre_path: pre_deleted})
    assert old_deletes is not None
    delete_files: tuple[DeleteFileInfo, ...] = (old_deletes,)
    files = (DataFileInfo(pre_path, 2 * len(prebatch), 0, min(prebatch), max(prebatch)),)

    effect = fold_keyed(frozenset({7}), txns, schema=SCHEMA, key_names=("id",))
    fast = write_effect(effect, ("id",), target(tmp_path / "fast", files, delete_files))
    delta = fold_table(frozenset({7}), True, txns)
    slow = apply_delta(delta, ("id",), target(tmp_path / "slow", files, delete_files))
    assert effect.truncated == delta.truncated == truncated
    assert effect.n_changes == delta.n_changes
    want = expected_rows(state)
    if truncated:
        pre_deleted = np.arange(2 * len(prebatch))
    fast_deletes = [d.path for d in fast.deletes]
    slow_deletes = [d.path for d in slow.deletes]
    got_fast = result_rows(tmp_path, pre_path, pre_deleted, fast.added, fast_deletes)
    got_slow = result_rows(tmp_path, pre_path, pre_deleted, slow.added, slow_deletes)
    assert got_fast == want
    assert got_slow == want
    # Merge-on-read: nothing of the pre-batch file is rewritten.
    assert fast.rows_written == len(effect.upserts)


def test_a_key_change_with_unchanged_toast_needs_the_row_wise_fold(tmp_path: Path) -> None:
    w = SpoolWriter(tmp_path / "s.spool")
    new = m.TupleData(b"tut", (b"2", m.UNCHANGED, b"5"))
    w.append(encode(m.Update(None, 7, "K", key_tup(1, 3), new)), False)
    w.flush()
    txn = TxnInput(0, 10, 100, (w.segment(0),), (V1,))
    with pytest.raises(NeedsRowFold):
        fold_keyed(frozenset({7}), [txn], schema=SCHEMA, key_names=("id",))


def test_pruned_files_are_not_read(tmp_path: Path) -> None:
    """A file whose key bounds miss every removed key is skipped (it does not even exist)."""
    w = SpoolWriter(tmp_path / "s.spool")
    w.append(encode(m.Delete(None, 7, "K", key_tup(5, 3))), False)
    w.flush()
    txn = TxnInput(0, 10, 100, (w.segment(0),), (V1,))
    effect = fold_keyed(frozenset({7}), [txn], schema=SCHEMA, key_names=("id",))
    missing = DataFileInfo(str(tmp_path / "nope.parquet"), 10, 0, 100, 200)
    out = write_effect(effect, ("id",), target(tmp_path / "o", (missing,)))
    assert out.deletes == [] and out.added == []


@pytest.mark.parametrize("shipped", [False, True])
def test_an_error_in_coalesced_transactions_names_the_exact_one(
    tmp_path: Path, shipped: bool
) -> None:
    """Back-to-back transactions are read as one; an error still names its own xid,
    also when the driver coalesced them (every fold path)."""
    from sparkapply.errors import SparkapplyError

    w = SpoolWriter(tmp_path / "s.spool")
    txns = []
    for t in range(3):
        start = w.offset
        row = {"id": t, "name": "x", "qty": 1}
        good = encode(m.Insert(None, 7, tup(row, 3)))
        w.append(encode(m.Update(None, 7, None, None, tup(row, 3))) if t != 1 else good[:-2], False)
        w.flush()
        txns.append(TxnInput(t, 500 + t, 9000 + t, (w.segment(start),), (V1,)))
    assert len(coalesced(txns)) == 1 and coalesced(txns)[0].members == 3
    if shipped:
        txns = pickle.loads(pickle.dumps(coalesced(txns)))
    with pytest.raises(SparkapplyError) as info:
        fold_keyed(frozenset({7}), txns, schema=SCHEMA, key_names=("id",))
    assert info.value.context["xid"] == 501
    assert info.value.context["lsn"] == 9001
    with pytest.raises(SparkapplyError) as info:
        fold_table(frozenset({7}), True, txns)
    assert info.value.context["xid"] == 501
    assert info.value.context["lsn"] == 9001


def test_coalescing_round_trips(tmp_path: Path) -> None:
    """Runs split back into their transactions; coalescing is idempotent and may be
    done in pieces; a run pickles to an equal run."""
    rnd = random.Random(5)
    w = SpoolWriter(tmp_path / "s.spool")
    other = SpoolWriter(tmp_path / "t.spool")
    txns = []
    for t in range(200):
        spool = other if rnd.random() < 0.1 else w
        if rnd.random() < 0.1:
            spool.append(b"gap", False)  # another table's transaction in between
        start = spool.offset
        for _ in range(rnd.randint(1, 3)):
            spool.append(encode(m.Delete(None, 7, "K", key_tup(t, 3))), False)
        spool.flush()
        rels = (V2,) if rnd.random() < 0.05 else (V1,)
        segments: tuple[SpoolSegment, ...] = (spool.segment(start),)
        if rnd.random() < 0.05:  # a streamed transaction's spool and its stream's
            first = other.append(encode(m.Delete(None, 7, "K", key_tup(t, 3))), False)
            other.flush()
            segments = (other.segment(first), *segments)
        txns.append(TxnInput(t, 100 + t, 1000 + 3 * t, segments, rels))
    runs = coalesced(txns)
    assert 1 < len(runs) < len(txns)
    assert sum(r.members for r in runs) == len(txns)
    assert uncoalesced(runs) == txns
    assert coalesced(runs) == runs
    assert coalesced([*coalesced(txns[:77]), *coalesced(txns[77:])]) == runs
    assert any(len(t.segments) == 2 for t in runs)
    planned = Runs()  # as the planner adds shares: values, no input objects
    for txn in txns:
        planned.add_one(txn.ordinal, txn.xid, txn.commit_lsn, txn.segments, txn.relations)
    assert planned.inputs() == runs
    assert pickle.loads(pickle.dumps(runs)) == runs
    assert pickle.loads(pickle.dumps(txns)) == txns
    for r in runs:
        assert r.commit_lsn == max(t.commit_lsn for t in uncoalesced([r]))


@pytest.mark.parametrize("seed", range(12))
def test_partitioned_folds_together_equal_the_model(seed: int, tmp_path: Path) -> None:
    """Three tasks, each owning a key-hash partition (key-change chains kept together),
    write what one task writes."""
    rnd = random.Random(seed * 31)
    prebatch: dict[int, Row] = {
        k: {"id": k, "name": f"pre {k}", "qty": k % 7}
        for k in sorted(rnd.sample(range(1, 300), 60))
    }
    txns, state, truncated = workload(seed, tmp_path, prebatch, toast=seed % 2 == 1)
    if truncated:
        return  # a TRUNCATE is a barrier: such batches are never partitioned
    pre_path, pre_deleted = prebatch_file(tmp_path, prebatch)
    old_deletes = TableWriter(str(tmp_path / "setup"), SCHEMA).write_deletes(
        {pre_path: pre_deleted}
    )
    assert old_deletes is not None
    files = (DataFileInfo(pre_path, 2 * len(prebatch), 0, min(prebatch), max(prebatch)),)
    added: list[str] = []
    deletes: list[str] = []
    owned = 0
    for i in range(3):
        effect = fold_keyed(
            frozenset({7}), txns, schema=SCHEMA, key_names=("id",), partition=(i, 3)
        )
        owned += effect.upserts.num_rows
        out = write_effect(effect, ("id",), target(tmp_path / f"p{i}", files, (old_deletes,)))
        added += out.added
        deletes += [d.path for d in out.deletes]
    assert result_rows(tmp_path, pre_path, pre_deleted, added, deletes) == expected_rows(state)
    whole = fold_keyed(frozenset({7}), txns, schema=SCHEMA, key_names=("id",))
    assert owned == whole.upserts.num_rows
