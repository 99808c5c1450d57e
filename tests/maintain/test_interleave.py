"""Maintenance interleaved with the apply on the same table, end to end: a real
publisher, the subscriber applying batches, compaction and expiry between them. The
mirror stays equal to the publisher and no maintenance run moves the applied LSN."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sparkapply.config import MaintenanceConfig
from sparkapply.maintain import Maintainer
from sparkapply.maintain.plan import health
from sparkapply.sink import applied_lsn
from tests.mirror import Mirror

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLE = ("public", "a")


def test_compaction_between_apply_batches(mirror: Mirror, spark: Any) -> None:
    mirror.sql(
        "CREATE TABLE a (id int PRIMARY KEY, v text, n int)",
        "CREATE PUBLICATION pub FOR TABLE a",
        "INSERT INTO a SELECT g, 'v' || g, g FROM generate_series(1, 500) g",
    )
    # Only this test's maintainer runs (the run loop's own is the random e2e's subject).
    mirror.config = dataclasses.replace(mirror.config, maintenance=MaintenanceConfig(enabled=False))
    mirror.run()
    maintainer = Maintainer(
        MaintenanceConfig(
            max_data_files=3,
            max_delete_files=3,
            retain_snapshots=2,
            retain_seconds=0,
            orphan_grace_seconds=0,
            orphan_interval_seconds=0,
        ),
        spark,
        mirror.catalog,
    )
    compactions = 0
    for r in range(6):
        mirror.sql(
            f"INSERT INTO a SELECT g, 'new', {r} FROM generate_series({1000 + 100 * r}, "
            f"{1040 + 100 * r}) g",
            f"UPDATE a SET v = 'round {r}', n = n + 1 WHERE id % 7 = {r}",
            f"DELETE FROM a WHERE id % 11 = {r}",
            f"UPDATE a SET id = id + 100000 WHERE id = {10 + r}",  # a key change
        )
        mirror.run()
        lsn = applied_lsn(mirror.catalog.load_table(TABLE))
        for report in maintainer.run_due([TABLE]):
            compactions += bool(report.compaction and report.compaction.snapshot_id)
        table = mirror.catalog.load_table(TABLE)
        assert applied_lsn(table) == lsn
        mirror.assert_mirrored("public.a")
    assert compactions >= 2
    final = health(mirror.catalog.load_table(TABLE))
    assert final.data_files <= 4 and final.delete_files <= 4
