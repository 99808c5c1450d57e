"""The cut log (sink/cuts.py) on a real SQLite catalog: cuts committed with their
batch, what they protect, and the cuts table rewritten to the kept cuts."""

from __future__ import annotations

from pyiceberg.catalog import Catalog

from sparkapply.lsn import Lsn
from sparkapply.sink import current_data_files, current_snapshot_id, ensure_table, read_table
from sparkapply.sink.atomic import commit_together
from sparkapply.sink.commit import stage_files
from sparkapply.sink.cuts import CutLog, read_cuts
from tests.mirror import assert_readers_agree
from tests.readers import Readers

from .conftest import ORDERS, orders_schema
from .executor_files import write_orders

LINES = ("public", "lines")
CUTS = ("sparkapply", "cuts")


def test_cuts_commit_with_their_batch_protect_their_snapshots_and_are_pruned(
    catalog: Catalog,
) -> None:
    orders = ensure_table(catalog, ORDERS, orders_schema())
    lines = ensure_table(catalog, LINES, orders_schema())
    log = CutLog(catalog, CUTS, retain_seconds=3600)
    log.track([ORDERS, LINES])
    named: list[dict[str, int]] = []
    for i in range(1, 6):
        batch = [
            stage_files(
                t,
                added=[write_orders(t, [i])],
                lsn=Lsn(100 * i),
                base_snapshot_id=current_snapshot_id(t),
            )
            for t in ((orders, lines) if i % 2 else (orders,))  # lines: every other batch
        ]
        staged, cut = log.stage(batch, lsn=Lsn(100 * i + 5), committed_at=None)
        commit_together(catalog, [*batch, staged])
        log.committed(batch, cut)
        named.append(cut.tables)

    cuts = read_cuts(catalog.load_table(CUTS))
    assert [int(c.lsn) for c in cuts] == [105, 205, 305, 405, 505]
    assert [c.tables for c in cuts] == named
    # A table the batch did not touch is named at its snapshot of the batch before.
    assert named[1]["public.lines"] == named[0]["public.lines"]
    assert named[4]["public.orders"] == catalog.load_table(ORDERS).metadata.current_snapshot_id
    assert log.protected(ORDERS) == {c["public.orders"] for c in named}
    assert log.protected(LINES) == {c["public.lines"] for c in named}
    for cut in cuts:  # each names exactly the rows up to its batch
        got = read_table(catalog.load_table(ORDERS), snapshot_id=cut.tables["public.orders"])
        assert sorted(got.column("id").to_pylist()) == list(range(1, int(cut.lsn) // 100 + 1))

    assert len(current_data_files(log.table)) == 5
    log.prune()
    table = catalog.load_table(CUTS)
    assert len(current_data_files(table)) == 1
    assert [c.tables for c in read_cuts(table)] == named  # all young: all kept
    with Readers() as readers:
        assert_readers_agree("sparkapply.cuts", table, read_table(table), readers)

    # A new log (a restart) reads the kept cuts back, and protects the same snapshots.
    again = CutLog(catalog, CUTS, retain_seconds=3600)
    assert again.protected(ORDERS) == log.protected(ORDERS)
    assert again.latest() is not None and again.latest().lsn == Lsn(505)  # type: ignore[union-attr]


def test_the_next_cut_commits_on_the_cuts_table_maintenance_expired(catalog: Catalog) -> None:
    """Expiry of the cuts table runs beside the apply (its own thread, under the table's
    lock): told of it, the log stages the next cut on the new metadata; not told, the
    catalog transaction would be refused (the base moved)."""
    import datetime as dt

    import pytest

    from sparkapply.errors import CommitConflictError
    from sparkapply.sink.maintenance import expire_and_delete

    ensure_table(catalog, ORDERS, orders_schema())
    log = CutLog(catalog, CUTS, retain_seconds=3600)
    log.track([ORDERS])

    def batch(i: int) -> None:
        table = catalog.load_table(ORDERS)
        staged_orders = stage_files(
            table,
            added=[write_orders(table, [i])],
            lsn=Lsn(100 * i),
            base_snapshot_id=current_snapshot_id(table),
        )
        staged, cut = log.stage([staged_orders], lsn=Lsn(100 * i + 5), committed_at=None)
        commit_together(catalog, [staged_orders, staged])
        log.committed([staged_orders], cut)

    for i in range(1, 5):
        batch(i)
    beside = catalog.load_table(CUTS)  # maintenance's own copy of the table
    out = expire_and_delete(beside, older_than=dt.datetime.now(dt.UTC), retain_last=1)
    assert out.snapshots_expired == 3 and out.files_deleted >= 3
    with pytest.raises(CommitConflictError):
        batch(5)  # staged on the metadata the log held before the expiry
    log.changed(CUTS)
    batch(6)
    cuts = read_cuts(catalog.load_table(CUTS))
    assert [int(c.lsn) for c in cuts] == [105, 205, 305, 405, 605]
    assert len(catalog.load_table(CUTS).metadata.snapshots) == 2


def test_the_newest_cut_is_protected_however_old(catalog: Catalog) -> None:
    """A mirror stopped (or a publisher quiet) for longer than retain_seconds: its
    newest cut is older than that, and still kept, by the run's log and by
    ``sparkapply maintain``'s reading of the cuts table."""
    import time

    from sparkapply.sink.cuts import protected_snapshots

    orders = ensure_table(catalog, ORDERS, orders_schema())
    log = CutLog(catalog, CUTS, retain_seconds=0.2)
    log.track([ORDERS])
    named: set[int] = set()
    for i in (1, 2):
        staged_orders = stage_files(
            orders,
            added=[write_orders(orders, [i])],
            lsn=Lsn(100 * i),
            base_snapshot_id=current_snapshot_id(orders),
        )
        staged, cut = log.stage([staged_orders], lsn=Lsn(100 * i + 5), committed_at=None)
        commit_together(catalog, [staged_orders, staged])
        log.committed([staged_orders], cut)
        named.add(cut.tables["public.orders"])
    time.sleep(0.5)  # older than retain_seconds now (kept: the last minute's cuts are)
    assert CutLog(catalog, CUTS, retain_seconds=0.2).protected(ORDERS) == named
    assert protected_snapshots(catalog, CUTS, 0.2)(ORDERS) == named
