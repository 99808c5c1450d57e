"""The sink contract (sink/contract.py) kept by IcebergSink on a real SQLite catalog:
load, evolve, one batch with its cut, a refused batch leaving nothing, expiry, removal."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from sparkapply.apply.write.parquet import TableWriter
from sparkapply.datafiles import arrow_schema_of, data_directory
from sparkapply.errors import CommitConflictError
from sparkapply.lsn import Lsn
from sparkapply.pgoutput.messages import Relation, RelationColumn
from sparkapply.sink import applied_lsn, contract, read_table
from sparkapply.sink.cuts import CutLog, read_cuts
from sparkapply.sink.files import live_files

from .executor_files import write_data_file

INT8, TEXT = 20, 25
ITEMS = ("public", "items")
TAGS = ("public", "tags")
CUTS = ("sparkapply", "cuts")


def relation(*extra: str, rel_id: int = 1) -> Relation:
    columns = (RelationColumn(1, "id", INT8, -1), RelationColumn(0, "note", TEXT, -1))
    return Relation(
        None,
        rel_id,
        "public",
        "t",
        "d",
        (*columns, *(RelationColumn(0, c, TEXT, -1) for c in extra)),
    )


def rows(state: contract.TableState, ids: list[int]) -> str:
    schema = arrow_schema_of(state.table)
    data = {f.name: [i if f.name == "id" else f"{f.name} {i}" for i in ids] for f in schema}
    return write_data_file(state.table, pa.Table.from_pydict(data, schema=schema))


def ids(state: contract.TableState) -> list[int]:
    return sorted(read_table(state.table).column("id").to_pylist())


def test_load_evolve_commit_a_batch_with_its_cut(catalog: Catalog) -> None:
    cuts = CutLog(catalog, CUTS, retain_seconds=3600)
    sink: contract.Sink = contract.IcebergSink(catalog, cuts=cuts)
    items = sink.load_table(ITEMS, relation())
    assert (items.applied, items.snapshot_id) == (Lsn(0), None)
    items = sink.evolve_table(items, relation("colour"), lsn=Lsn(5))
    assert [f.name for f in items.table.schema().fields] == ["id", "note", "colour"]
    tags = sink.load_table(TAGS, relation(rel_id=2))

    first = sink.commit_batch(
        [
            contract.TableChange(items, Lsn(10), added=[rows(items, [1, 2, 3])]),
            contract.TableChange(tags, Lsn(10), added=[rows(tags, [7])]),
        ],
        cut=contract.CutPoint(Lsn(10), dt.datetime.now(dt.UTC)),
    )
    items, tags = sink.load_table(ITEMS, relation()), sink.load_table(TAGS, relation(rel_id=2))
    assert [items.snapshot_id, tags.snapshot_id] == first
    assert (items.applied, tags.applied) == (Lsn(10), Lsn(10))
    [cut] = read_cuts(catalog.load_table(CUTS))
    assert cut.lsn == Lsn(10) and cut.tables == {"public.items": first[0], "public.tags": first[1]}

    data, deletes = sink.live_files(items, "id")
    assert [(d.key_lower, d.key_upper) for d in data] == [(1, 3)] and deletes == []
    writer = TableWriter(data_directory(items.table), arrow_schema_of(items.table))
    gone = writer.write_deletes({data[0].path: np.array([1])})
    assert gone is not None
    sink.commit_batch(
        [contract.TableChange(items, Lsn(20), added=[rows(items, [4])], deletes=[gone])]
    )
    assert ids(sink.load_table(ITEMS, relation())) == [1, 3, 4]


@pytest.mark.parametrize("atomic", [True, False])
def test_a_refused_batch_commits_nothing_and_removes_its_files(
    catalog: Catalog, atomic: bool
) -> None:
    sink = contract.IcebergSink(catalog, atomic=atomic)
    items, tags = sink.load_table(ITEMS, relation()), sink.load_table(TAGS, relation(rel_id=2))
    sink.commit_batch([contract.TableChange(tags, Lsn(10), added=[rows(tags, [1])])])
    # tags moved on since its state was loaded: the batch planned against a stale base.
    batch = [
        contract.TableChange(items, Lsn(20), added=[rows(items, [1])]),
        contract.TableChange(tags, Lsn(20), added=[rows(tags, [2])]),
    ]
    with pytest.raises(CommitConflictError):
        sink.commit_batch(batch)
    tags_now = sink.load_table(TAGS, relation(rel_id=2))
    assert applied_lsn(tags_now.table) == Lsn(10) and ids(tags_now) == [1]
    items_now = sink.load_table(ITEMS, relation())
    # Refused while staging, before any table committed: nothing of the batch.
    assert items_now.snapshot_id is None and ids(items_now) == []
    written = [*batch[0].files, *batch[1].files]
    assert not any(items_now.table.io.new_input(p).exists() for p in written)


def test_expire_and_remove_files(catalog: Catalog) -> None:
    sink = contract.IcebergSink(catalog)
    items = sink.load_table(ITEMS, relation())
    for lsn in (10, 20, 30):
        sink.commit_batch([contract.TableChange(items, Lsn(lsn), added=[rows(items, [lsn])])])
        items = sink.load_table(ITEMS, relation())
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    assert sink.expire(items.table, contract.Retention(later, retain_last=1, free_files=True)) == 2
    assert len(items.table.metadata.snapshots) == 1 and ids(items) == [10, 20, 30]

    stray = rows(items, [99])
    live = list(live_files(items.table).data)
    assert sink.remove_files(items.table, [stray, live[0]]) == [stray]  # never a live file
    assert ids(items) == [10, 20, 30]
