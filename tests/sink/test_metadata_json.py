"""A table's metadata.json with its snapshots' JSON kept between commits
(sink/metadata_json.py): the same JSON values pyiceberg writes, commit after commit,
read back by pyiceberg and by the three readers."""

from __future__ import annotations

import datetime as dt
import json

from pyiceberg.catalog import Catalog
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table

from sparkapply.lsn import Lsn
from sparkapply.sink import commit_files, current_snapshot_id, read_table
from sparkapply.sink.atomic import commit_together
from sparkapply.sink.commit import stage_files
from sparkapply.sink.maintenance import expire_and_delete
from sparkapply.sink.metadata_json import MetadataJson
from tests.mirror import assert_readers_agree
from tests.readers import Readers

from .conftest import ORDERS
from .executor_files import write_orders


def pyiceberg_json(table: Table) -> object:
    return json.loads(table.metadata.model_dump_json())


def test_the_metadata_is_pyicebergs_at_every_commit(catalog: Catalog, orders: Table) -> None:
    serializer = MetadataJson()
    assert json.loads(serializer.dumps(orders.metadata)) == pyiceberg_json(orders)  # none yet
    for lsn in range(1, 13):
        commit_files(orders, added=[write_orders(orders, [lsn], note=f"{lsn}")], lsn=Lsn(lsn))
        orders = catalog.load_table(ORDERS)
        ours = serializer.dumps(orders.metadata)
        assert json.loads(ours) == pyiceberg_json(orders), lsn
    # Expired snapshots leave the JSON and what is kept of them.
    expire_and_delete(orders, older_than=dt.datetime.now(dt.UTC), retain_last=4)
    orders = catalog.load_table(ORDERS)
    assert len(orders.metadata.snapshots) == 4
    assert json.loads(serializer.dumps(orders.metadata)) == pyiceberg_json(orders)
    (kept,) = serializer._kept.values()
    assert set(kept) == {s.snapshot_id for s in orders.metadata.snapshots}


def test_a_snapshot_is_serialized_once_while_it_is_kept(orders: Table, catalog: Catalog) -> None:
    for lsn in (1, 2):
        commit_files(orders, added=[write_orders(orders, [lsn])], lsn=Lsn(lsn))
    orders = catalog.load_table(ORDERS)
    serializer = MetadataJson()
    serializer.dumps(orders.metadata)
    (first,) = serializer._kept.values()
    serializer.dumps(orders.metadata)
    (again,) = serializer._kept.values()
    assert all(again[k][1] is first[k][1] for k in first)  # the same strings, not remade
    # Another object of the same snapshot id (a table loaded again) is serialized anew.
    reloaded = catalog.load_table(ORDERS)
    serializer.dumps(reloaded.metadata)
    (fresh,) = serializer._kept.values()
    assert all(fresh[k][1] is not first[k][1] and fresh[k][1] == first[k][1] for k in first)


def test_batches_committed_together_read_back_in_every_reader(
    catalog: Catalog, orders: Table
) -> None:
    for lsn in range(1, 6):
        staged = stage_files(
            orders,
            added=[write_orders(orders, [lsn, 100 + lsn])],
            lsn=Lsn(lsn),
            base_snapshot_id=current_snapshot_id(orders),
        )
        commit_together(catalog, [staged])
        orders = catalog.load_table(ORDERS)
        written = FromInputFile.table_metadata(orders.io.new_input(orders.metadata_location))
        assert written == orders.metadata
        assert json.loads(written.model_dump_json()) == pyiceberg_json(orders)
    data = read_table(orders)
    assert sorted(data.column("id").to_pylist()) == [*range(1, 6), *range(101, 106)]
    with Readers() as readers:
        assert_readers_agree("orders", orders, data, readers)
