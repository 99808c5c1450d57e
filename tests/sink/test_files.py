"""The listing cache: equal to a fresh listing after every kind of commit, whoever made it."""

from __future__ import annotations

import datetime as dt
import random

import numpy as np
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sparkapply.apply.write.parquet import TableWriter
from sparkapply.datafiles import DataFileInfo, DeleteFileInfo, data_directory
from sparkapply.errors import SinkError
from sparkapply.lsn import Lsn
from sparkapply.sink import commit_files
from sparkapply.sink.files import LiveFileCache, data_file_infos, delete_file_infos, live_files
from sparkapply.sink.maintenance import expire_snapshots
from sparkapply.sink.rewrite import commit_rewrite

from .conftest import ORDERS
from .executor_files import ORDERS_ARROW, write_orders
from .merge_on_read import delete_row


def fresh(catalog: Catalog, key: str | None) -> tuple[list[DataFileInfo], list[DeleteFileInfo]]:
    table = catalog.load_table(ORDERS)
    live = live_files(table)
    return data_file_infos(table, live, key), delete_file_infos(live)


def assert_same(cache: LiveFileCache, table: Table, catalog: Catalog) -> None:
    for key in ("id", None):
        data, deletes = cache.listing(table, key)
        want_data, want_deletes = fresh(catalog, key)
        assert sorted(data, key=lambda d: d.path) == sorted(want_data, key=lambda d: d.path)
        assert sorted(deletes, key=lambda d: d.path) == sorted(want_deletes, key=lambda d: d.path)
    cached = cache.live_files(table)
    want = live_files(catalog.load_table(ORDERS))
    assert cached.data.keys() == want.data.keys()
    assert sorted(f.file_path for f in cached.deletes) == sorted(f.file_path for f in want.deletes)


def delete_info(table: Table, positions: dict[str, list[int]]) -> DeleteFileInfo:
    info = TableWriter(data_directory(table), ORDERS_ARROW).write_deletes(
        {p: np.array(v) for p, v in positions.items()}
    )
    assert info is not None
    return info


def test_the_cache_equals_a_fresh_listing_through_a_random_history(
    catalog: Catalog, orders: Table
) -> None:
    rnd = random.Random(20261123)
    cache = LiveFileCache()
    assert cache.listing(orders, "id") == ([], [])
    lsn = 0x10
    next_id = 1
    for step in range(40):
        lsn += 0x10
        table = catalog.load_table(ORDERS)
        files = list(live_files(table).data)
        action = rnd.choice(["append", "append", "delta", "delta", "rewrite", "merge", "other"])
        if step % 17 == 16:
            action = "truncate"
        if action == "append" or not files:
            n = rnd.randint(1, 5)
            added = write_orders(orders, list(range(next_id, next_id + n)))
            next_id += n
            commit_files(orders, added=[added], lsn=Lsn(lsn))
        elif action == "delta":  # our row delta: new versions and position deletes
            victim = rnd.choice(files)
            deletes = [delete_info(orders, {victim: [0]})]
            new = write_orders(orders, [next_id])
            next_id += 1
            commit_files(orders, added=[new], deletes=deletes, lsn=Lsn(lsn))
        elif action == "truncate":
            added = write_orders(orders, [next_id])
            next_id += 1
            commit_files(orders, added=[added], truncate=True, lsn=Lsn(lsn))
        elif action == "rewrite":  # a compaction: files replaced, deletes folded
            victims = rnd.sample(files, min(len(files), 2))
            live = live_files(orders)
            gone = [d.file_path for d in live.deletes]
            merged = write_orders(orders, [next_id, next_id + 1])
            next_id += 2
            base = orders.metadata.current_snapshot_id
            assert base is not None
            commit_rewrite(
                orders, base_snapshot_id=base, added_data=[merged], removed=victims + gone
            )
        elif action == "merge":  # a manifest merge: same files, new manifests
            base = orders.metadata.current_snapshot_id
            assert base is not None
            commit_rewrite(orders, base_snapshot_id=base)
        else:  # another engine's position delete, through another table object
            other = catalog.load_table(ORDERS)
            delete_row(other, rnd.choice(files), 0)
            orders = catalog.load_table(ORDERS)
        if rnd.random() < 0.2:
            expire_snapshots(orders, older_than=dt.datetime.now(dt.UTC), retain_last=2)
        orders = catalog.load_table(ORDERS)
        assert_same(cache, orders, catalog)


def test_a_commit_reads_only_its_new_manifests(catalog: Catalog, orders: Table) -> None:
    cache = LiveFileCache()
    first = write_orders(orders, [1, 2, 3])
    commit_files(orders, added=[first], lsn=Lsn("0/10"))
    cache.listing(orders, "id")
    assert cache.manifests_read == 1
    for i in range(5):
        commit_files(
            orders,
            added=[write_orders(orders, [10 + i])],
            deletes=[delete_info(orders, {first: [i % 3]})],
            lsn=Lsn(f"0/{0x20 + i:X}"),
        )
        before = cache.manifests_read
        assert_same(cache, orders, catalog)
        assert cache.manifests_read == before + 2  # a data and a delete manifest
    # Nothing changed: nothing read.
    before = cache.manifests_read
    cache.listing(orders, "id")
    assert cache.manifests_read == before


def test_key_bounds_follow_the_key_column(orders: Table) -> None:
    cache = LiveFileCache()
    commit_files(orders, added=[write_orders(orders, [5, 9, 7])], lsn=Lsn("0/10"))
    (by_id,), _ = cache.listing(orders, "id")
    assert (by_id.key_lower, by_id.key_upper) == (5, 9)
    (by_qty,), _ = cache.listing(orders, "qty")
    assert (by_qty.key_lower, by_qty.key_upper) == (50, 90)
    (plain,), _ = cache.listing(orders, None)
    assert (plain.key_lower, plain.key_upper) == (None, None)


def test_a_manifest_that_cannot_be_listed_is_not_cached(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    cache = LiveFileCache()
    with pytest.MonkeyPatch.context() as mp:
        import sparkapply.sink.files as files_mod

        def refuse(table: Table, manifest: object) -> object:
            raise SinkError("table has equality-delete files, which sparkapply cannot apply")

        mp.setattr(files_mod, "_read_manifest", refuse)
        for _ in range(2):
            with pytest.raises(SinkError, match="equality-delete"):
                cache.listing(orders, "id")
    assert [d.key_lower for d in cache.listing(orders, "id")[0]] == [1]
