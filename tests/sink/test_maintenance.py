from __future__ import annotations

import datetime as dt

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sparkapply.lsn import Lsn
from sparkapply.sink import applied_lsn, commit_files, expire_snapshots, read_table

from .conftest import ORDERS
from .executor_files import write_orders

# Far enough ahead that snapshots made while the rest of the suite runs are older.
NOW = dt.datetime.now(dt.UTC) + dt.timedelta(days=365)


def test_expiry_keeps_the_newest_snapshots_and_the_applied_lsn(
    catalog: Catalog, orders: Table
) -> None:
    for i in range(1, 6):
        commit_files(orders, added=[write_orders(orders, [i])], lsn=Lsn(i))
    newest = [s.snapshot_id for s in orders.metadata.snapshots[-2:]]

    assert expire_snapshots(orders, older_than=NOW, retain_last=2) == 3
    reloaded = catalog.load_table(ORDERS)
    assert [s.snapshot_id for s in reloaded.metadata.snapshots] == newest
    assert applied_lsn(reloaded) == Lsn(5)
    assert read_table(reloaded).num_rows == 5
    assert expire_snapshots(reloaded, older_than=NOW, retain_last=2) == 0


def test_expiry_respects_the_age_limit(orders: Table) -> None:
    for i in range(1, 4):
        commit_files(orders, added=[], lsn=Lsn(i))
    long_ago = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    assert expire_snapshots(orders, older_than=long_ago, retain_last=1) == 0
    assert expire_snapshots(orders, older_than=NOW, retain_last=1) == 2
    assert applied_lsn(orders) == Lsn(3)


def test_expiry_arguments(orders: Table) -> None:
    assert expire_snapshots(orders, older_than=NOW) == 0  # no snapshots at all
    with pytest.raises(ValueError, match="timezone"):
        expire_snapshots(orders, older_than=dt.datetime(2000, 1, 1))
    with pytest.raises(ValueError, match="retain_last"):
        expire_snapshots(orders, older_than=NOW, retain_last=0)


def test_expiry_argument_errors_are_sink_errors_naming_the_table(orders: Table) -> None:
    from sparkapply.errors import SinkArgumentError, SinkError

    with pytest.raises(SinkArgumentError) as info:
        expire_snapshots(orders, older_than=dt.datetime(2000, 1, 1))
    assert isinstance(info.value, SinkError) and isinstance(info.value, ValueError)
    assert info.value.context["table"] == "public.orders"
