"""One catalog transaction for a batch's tables (sink/atomic.py), on the SQL catalog
over SQLite and over PostgreSQL (a database of its own on the test server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.update import update_table_metadata

from sparkapply.lsn import Lsn
from sparkapply.sink import (
    CommitConflictError,
    applied_lsn,
    commit_files,
    current_snapshot_id,
    ensure_table,
    open_catalog,
    read_table,
)
from sparkapply.sink.atomic import _updated, atomic_commits, commit_mode, commit_together
from sparkapply.sink.commit import StagedSnapshot, stage_files
from tests.conftest import PgServer
from tests.mirror import assert_readers_agree
from tests.readers import Readers

from .conftest import ORDERS, orders_schema
from .executor_files import write_orders

LINES = ("public", "lines")


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_catalog(
    request: pytest.FixtureRequest, tmp_path: Path, pg_server: PgServer
) -> Iterator[Catalog]:
    if request.param == "sqlite":
        uri = f"sqlite:///{tmp_path}/catalog.db"
        yield open_catalog("test", {"type": "sql", "uri": uri, "warehouse": str(tmp_path / "wh")})
        return
    name = pg_server.create_database("catalog")
    try:
        uri = pg_server.sqlalchemy_url(name)
        catalog = open_catalog("test", {"type": "sql", "uri": uri, "warehouse": str(tmp_path)})
        yield catalog
        catalog.engine.dispose()  # type: ignore[attr-defined]
    finally:
        pg_server.drop_database(name)


def stage(table: Table, ids: list[int], lsn: int) -> StagedSnapshot:
    path = write_orders(table, ids, note=f"lsn {lsn}")
    return stage_files(
        table, added=[path], lsn=Lsn(lsn), base_snapshot_id=current_snapshot_id(table)
    )


def ids(table: Table) -> list[int]:
    return sorted(read_table(table).column("id").to_pylist())


def test_a_batch_lands_in_every_table_at_once(sql_catalog: Catalog) -> None:
    assert atomic_commits(sql_catalog) and commit_mode(sql_catalog).startswith("atomic")
    orders = ensure_table(sql_catalog, ORDERS, orders_schema())
    lines = ensure_table(sql_catalog, LINES, orders_schema())
    staged = [stage(orders, [1, 2], 10), stage(lines, [7], 10)]
    commit_together(sql_catalog, staged)
    commit_together(sql_catalog, [stage(orders, [3], 20), stage(lines, [8, 9], 20)])

    for ident, want in ((ORDERS, [1, 2, 3]), (LINES, [7, 8, 9])):
        fresh = sql_catalog.load_table(ident)  # as another process sees it
        assert ids(fresh) == want and applied_lsn(fresh) == Lsn(20)
        assert len(fresh.metadata.snapshots) == 2
        with Readers() as readers:
            assert_readers_agree(".".join(ident), fresh, read_table(fresh), readers)
    assert orders.metadata_location == sql_catalog.load_table(ORDERS).metadata_location


def test_the_metadata_written_is_what_pyiceberg_would_write(sql_catalog: Catalog) -> None:
    """The batch's metadata is pyiceberg's updates applied without its deep copy: the
    same metadata, the metadata log included, and the table held is not changed."""
    orders = ensure_table(sql_catalog, ORDERS, orders_schema())
    commit_together(sql_catalog, [stage(orders, [1], 10)])
    staged = stage(orders, [2], 20)
    held = orders.metadata.model_dump()
    ours = _updated(orders, staged.delta.updates)
    theirs = update_table_metadata(
        orders.metadata, staged.delta.updates, metadata_location=orders.metadata_location
    )
    assert ours.model_dump() == theirs.model_dump()
    assert ours.metadata_log[-1].metadata_file == orders.metadata_location
    assert len(ours.metadata_log) == len(orders.metadata.metadata_log) + 1
    assert orders.metadata.model_dump() == held
    commit_together(sql_catalog, [staged])
    assert sql_catalog.load_table(ORDERS).metadata.model_dump() == ours.model_dump()


def test_a_table_that_moved_fails_the_whole_batch(sql_catalog: Catalog, tmp_path: Path) -> None:
    orders = ensure_table(sql_catalog, ORDERS, orders_schema())
    lines = ensure_table(sql_catalog, LINES, orders_schema())
    commit_together(sql_catalog, [stage(orders, [1], 10), stage(lines, [2], 10)])
    staged = [stage(orders, [3], 20), stage(lines, [4], 20)]
    # Another writer commits to `lines` after the batch planned against it.
    other = sql_catalog.load_table(LINES)
    commit_files(other, added=[write_orders(other, [5])], lsn=Lsn(15))
    before = sql_catalog.load_table(ORDERS).metadata_location

    with pytest.raises(CommitConflictError, match="committed by another process") as err:
        commit_together(sql_catalog, staged)
    assert err.value.context["table"] == "public.lines"
    # Nothing of the batch is visible, in the table that did not move either.
    assert sql_catalog.load_table(ORDERS).metadata_location == before
    assert ids(sql_catalog.load_table(ORDERS)) == [1]
    assert ids(sql_catalog.load_table(LINES)) == [2, 5]
    # Its manifests and metadata files are gone (only its data files are the caller's).
    for one in staged:
        for path in one.delta.written:
            assert not Path(path.removeprefix("file://")).exists(), path
    metadata_files = {
        p.name for p in Path(orders.location().removeprefix("file://"), "metadata").iterdir()
    }
    assert not any(n.startswith("00002-") for n in metadata_files), metadata_files
