"""Crash safety of maintenance: SIGKILL inside compaction (files written, nothing
committed) and inside expiry (snapshots expired, files not yet deleted). After the
kill the table is what it was; the next run's orphan sweep removes the leftovers."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sparkapply.lsn import Lsn
from sparkapply.sink import applied_lsn, commit_files
from sparkapply.sink.maintenance import referenced_files
from tests.mirror import killed
from tests.sink.conftest import ORDERS
from tests.sink.executor_files import write_orders

from .conftest import churn, files, rows
from .test_maintainer import write_config

pytestmark = [pytest.mark.slow]


def unreferenced(table: Table) -> set[str]:
    keep = {p.removeprefix("file://") for p in referenced_files(table)}
    return {p.removeprefix("file://") for p in files(table)} - keep


@pytest.mark.usefixtures("spark")
def test_kill_inside_compaction(
    catalog: Catalog, catalog_properties: dict[str, str], orders: Table, tmp_path: Path
) -> None:
    churn(orders, 5)
    before_rows, lsn, location = rows(orders), applied_lsn(orders), orders.metadata_location
    config = write_config(tmp_path, catalog_properties, orphan_grace_seconds=0)
    killed("compact-before-commit", "maintain", "--config", str(config))

    table = catalog.load_table(ORDERS)
    assert table.metadata_location == location  # nothing committed
    assert rows(table) == before_rows and applied_lsn(table) == lsn
    leftovers = unreferenced(table)
    assert any(p.endswith("-compacted.parquet") for p in leftovers)

    from sparkapply.cli import main

    assert main(["maintain", "--config", str(config)]) == 0
    table = catalog.load_table(ORDERS)
    assert rows(table) == before_rows and applied_lsn(table) == lsn
    assert not leftovers & {p.removeprefix("file://") for p in files(table)}


def test_kill_inside_expiry(
    catalog: Catalog, catalog_properties: dict[str, str], orders: Table, tmp_path: Path
) -> None:
    for i in range(1, 6):  # appends only, nothing to compact for a 1-byte target
        commit_files(orders, added=[write_orders(orders, [i])], lsn=Lsn(i))
    before_rows = rows(orders)
    config = write_config(
        tmp_path,
        catalog_properties,
        target_file_size=1,
        retain_snapshots=1,
        retain_seconds=0,
        orphan_grace_seconds=0,
    )
    killed("expire-before-delete", "maintain", "--config", str(config))

    table = catalog.load_table(ORDERS)
    assert len(table.metadata.snapshots) == 1  # the expiry committed...
    assert rows(table) == before_rows and applied_lsn(table) == Lsn(5)
    leftovers = unreferenced(table)
    assert any(p.endswith(".avro") for p in leftovers)  # ...its files stayed

    from sparkapply.cli import main

    assert main(["maintain", "--config", str(config)]) == 0
    table = catalog.load_table(ORDERS)
    assert rows(table) == before_rows and applied_lsn(table) == Lsn(5)
    assert unreferenced(table) == set()
