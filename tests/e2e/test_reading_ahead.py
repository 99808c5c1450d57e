"""Reading ahead while idle: the first batch after a quiet spell finds the files it
searches already read (run/subscriber.py, READING AHEAD)."""

from __future__ import annotations

import dataclasses

import pytest

from sparkapply.apply.write import file_cache
from sparkapply.apply.write.file_cache import ColumnCache
from sparkapply.config import ApplyConfig
from sparkapply.run.batch import BatchStats
from sparkapply.run.subscriber import Subscriber
from tests.mirror import Mirror, Running, wait_until

pytestmark = pytest.mark.integration


def _live_files(mirror: Mirror, table: str) -> tuple[set[str], set[str]]:
    """The data files and delete files of ``table``'s current snapshot."""
    tasks = list(mirror.iceberg_table(table).scan().plan_files())
    data = {t.file.file_path for t in tasks}
    deletes = {d.file_path for t in tasks for d in t.delete_files}
    return data, deletes


def _held(cache: ColumnCache) -> set[str]:
    return {path for path, _ in cache._entries}


def test_an_idle_subscriber_reads_ahead_what_the_next_batch_searches(
    mirror: Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ColumnCache()  # this process's cache, empty: the subscriber runs here
    monkeypatch.setattr(file_cache, "_cache", cache)
    mirror.sql(
        "CREATE TABLE t (id bigint PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 20000) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()  # the initial copy: nothing located yet, nothing read ahead
    assert not _held(cache)

    # Small batches fold on the driver (the default), where the cache is.
    config = dataclasses.replace(
        mirror.config,
        apply=dataclasses.replace(
            mirror.config.apply, driver_fold_bytes=ApplyConfig().driver_fold_bytes
        ),
        maintenance=dataclasses.replace(mirror.config.maintenance, enabled=False),
    )
    misses_at_batch: list[tuple[int, bool]] = []

    def on_batch(stats: BatchStats) -> None:
        on_driver = not any(r.tasks for r in stats.results)
        misses_at_batch.append((cache.misses, on_driver))

    sub = Subscriber(config, spark=mirror.spark, catalog=mirror.catalog, on_batch=on_batch)
    running = Running(sub)
    try:
        mirror.sql("UPDATE t SET v = 'updated' WHERE id = 1")  # the table is searched
        running.wait_flushed(mirror.insert_lsn())
        # Rows only inserted: their batch searches nothing, so their file is read by
        # no batch; reading ahead reads it, and the delete file of the update.
        mirror.sql("INSERT INTO t SELECT g, 'inserted' FROM generate_series(20001, 30000) g")
        running.wait_flushed(mirror.insert_lsn())
        data, deletes = _live_files(mirror, "public.t")
        assert len(data) >= 3 and deletes

        def read_ahead() -> bool:
            indexed = {p for p, cols in cache._entries if cols == ("\0index", "id")}
            return data | deletes <= _held(cache) and len(indexed) >= 2  # copied, inserted

        wait_until(read_ahead, "the idle subscriber to read the table's files ahead", 60)
        before = cache.misses

        # The next batch searches the inserted file and the copied one: both are held.
        mirror.sql("UPDATE t SET v = 'again' WHERE id IN (2, 25000)")
        running.wait_flushed(mirror.insert_lsn())
        misses, on_driver = misses_at_batch[-1]
        assert on_driver
        assert misses == before, "the batch read a file the read ahead should have"
    finally:
        running.stop()
    mirror.assert_mirrored("public.t")
