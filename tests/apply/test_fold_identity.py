"""The row-wise fold applies each change by the identity of its own relation version,
and refuses an UPDATE or DELETE for a table without identity, naming where."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sparkapply.apply.fold.rowwise import TxnInput, fold_table
from sparkapply.changes.spool import SpoolSegment, SpoolWriter
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.errors import ApplyError
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m
from sparkapply.plan.batch import identity_epochs
from sparkapply.storage import Storage
from tests.plan.test_lanes import txn


def relation(identity: str, key: tuple[str, ...]) -> m.Relation:
    cols = tuple(m.RelationColumn(int(n in key), n, 23, -1) for n in ("a", "b"))
    return m.Relation(None, 7, "public", "t", identity, cols)


NO_KEY = relation("d", ())
BY_A = relation("d", ("a",))
BY_B = relation("d", ("b",))
FULL = relation("f", ("a", "b"))


def tup(a: int, b: int) -> m.TupleData:
    return m.TupleData(b"tt", (str(a).encode(), str(b).encode()))


def spool(tmp_path: Path, *msgs: m.Message) -> TxnInput:
    w = SpoolWriter(tmp_path / "s.spool")
    for msg in msgs:
        w.append(encode(msg), False)
    w.close()
    return TxnInput(0, 812, 0x3A1C1A0, (SpoolSegment(str(w.path), 0, w.offset),), ())


@pytest.mark.parametrize(
    "change",
    [m.Update(None, 7, None, None, tup(1, 2)), m.Delete(None, 7, "O", tup(1, 1))],
)
def test_a_change_for_a_table_without_identity_names_its_transaction(
    tmp_path: Path, change: m.Message
) -> None:
    txn = spool(tmp_path, NO_KEY, m.Insert(None, 7, tup(1, 1)), change)
    with pytest.raises(ApplyError, match="without replica identity") as info:
        fold_table(frozenset({7}), False, [txn], table="public.t")
    assert info.value.context["xid"] == 812
    assert info.value.context["table"] == "public.t"
    assert "lsn" in info.value.context


def test_mixed_identities_in_one_transaction(tmp_path: Path) -> None:
    """Key a, then key b, then FULL, in one transaction: each change finds its row by
    its own identity, in the batch or before it."""
    txn = spool(
        tmp_path,
        BY_A,
        m.Insert(None, 7, tup(1, 10)),
        m.Update(None, 7, None, None, tup(1, 11)),  # in-batch row a=1
        m.Update(None, 7, None, None, tup(2, 20)),  # pre-batch row a=2
        BY_B,
        m.Update(None, 7, None, None, tup(1, 11)),  # in-batch row b=11, by key b
        m.Delete(None, 7, "K", m.TupleData(b"nt", (None, b"30"))),  # pre-batch b=30
        FULL,
        m.Delete(None, 7, "O", tup(2, 20)),  # the in-batch row, by image
        m.Delete(None, 7, "O", tup(4, 40)),  # a pre-batch row, by image
    )
    delta = fold_table(frozenset({7}), False, [txn], mixed=True)
    assert [tuple(r.values) for r in delta.upserts()] == [(b"1", b"11")]
    assert {names: list(keys) for names, keys in delta.remove_by.items()} == {
        ("a",): [(b"2",)],
        ("b",): [(b"30",)],
    }
    assert [image for (_, image) in delta.removes] == [(b"4", b"40")]


def committed(xid: int, start: m.Relation, inside: tuple[m.Relation, ...]) -> CommittedTxn:
    return dataclasses.replace(txn(xid, xid, 7), relations={7: start}, relation_messages=inside)


def test_a_batch_is_cut_where_a_table_changes_identity() -> None:
    batch = [
        committed(1, BY_A, ()),
        committed(2, BY_A, ()),
        committed(3, BY_A, (FULL,)),  # ALTER ... REPLICA IDENTITY FULL before it
        committed(4, FULL, ()),
        committed(5, FULL, (BY_B,)),
    ]
    parts = identity_epochs(batch)
    assert [[t.xid for t in p] for p in parts] == [[1, 2], [3, 4], [5]]
    assert identity_epochs(batch[:2]) == [batch[:2]]


def test_a_bug_in_a_task_names_table_and_lsns_and_offers_no_skip(tmp_path: Path) -> None:
    """An exception of our own code (here: a schema without the key column) comes back
    as an InternalError naming the table, the LSN range and the line of our code it
    came through last; `skip` is not offered."""
    import pickle

    import pyarrow as pa

    from sparkapply.apply.tasks import TableTask, run_table_task
    from sparkapply.errors import InternalError

    txn = spool(tmp_path, BY_A, m.Insert(None, 7, tup(1, 1)), m.Delete(None, 7, "K", tup(1, 1)))
    task = TableTask(
        table="public.t",
        relation_ids=frozenset({7}),
        key_names=("a",),
        txns=(txn,),
        schema=pa.schema([pa.field("b", pa.int32())]),
        data_files=(),
        delete_files=(),
        data_dir=str(tmp_path / "d"),
        proto_version=4,
        streaming="parallel",
        storage=Storage(),
    )
    error = pickle.loads(pickle.dumps(run_table_task(task).error))
    assert isinstance(error, InternalError)
    assert error.context["table"] == "public.t"
    assert error.context["lsns"] == "0/3A1C1A0..0/3A1C1A0"
    file, line = error.context["at"].rsplit(":", 1)  # our innermost line: where to look
    assert file.startswith("apply/") and file.endswith(".py") and int(line) > 0
    assert "skip" not in str(error) and "bug in sparkapply" in str(error)


def test_a_new_key_is_located_in_files_written_before_its_column(tmp_path: Path) -> None:
    """The key moved to a column added later: files written before it have no such
    column, read as nulls (no match), while newer files are searched as usual."""
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkapply.apply.write.locate import locate_keys
    from sparkapply.datafiles import DataFileInfo

    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    pq.write_table(pa.table({"id": [1, 2]}), old)
    ids = [uuid.uuid4().bytes for _ in range(3)]
    pq.write_table(pa.table({"id": [3, 4, 5], "uid": pa.array(ids, pa.binary(16))}), new)
    files = [DataFileInfo(f"file://{p}", 2, 1) for p in (old, new)]
    wanted = pa.ExtensionArray.from_storage(pa.uuid(), pa.array([ids[1]], pa.binary(16)))
    found = locate_keys([wanted], ["uid"], files, [])
    assert {p: list(v) for p, v in found.items()} == {f"file://{new}": [1]}
