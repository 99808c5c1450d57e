"""``sparkapply demo`` as a user sees it, and the content checksums it ends with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkapply.demo import arrow_checksum, pg_checksum
from sparkapply.sink.read import read_table
from tests.mirror import Mirror

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_checksums_agree_and_see_one_changed_value(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE t (id bigint PRIMARY KEY, n int, amount numeric(12,2), s text, "
        "at timestamptz, ts timestamp, doc jsonb, ok boolean)",
        "INSERT INTO t SELECT g, CASE WHEN g % 5 = 0 THEN NULL ELSE g END, g / 3.0, "
        "'row ' || g, timestamptz '2026-01-01 12:00:00.123456+02' + g * interval '1 s', "
        "timestamp '2026-01-01' + g * interval '1 ms', jsonb_build_object('g', g, 'x', 'y'), "
        "g % 2 = 0 FROM generate_series(1, 500) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    mirror.sql(
        "UPDATE t SET s = NULL, amount = -amount WHERE id % 7 = 0",
        "DELETE FROM t WHERE id % 11 = 0",
    )
    mirror.run()
    columns = ["id", "n", "amount", "s", "at", "ts", "doc", "ok"]

    def iceberg() -> object:
        return arrow_checksum(read_table(mirror.catalog.load_table(("public", "t"))), columns)

    want = pg_checksum(mirror.dsn, "public.t")
    assert want.rows == 500 - 45
    assert iceberg() == want
    # One value changed on one side only (not replicated again): the checksum tells.
    mirror.sql("UPDATE t SET s = 'row 1!' WHERE id = 1")
    changed = pg_checksum(mirror.dsn, "public.t")
    assert changed.rows == want.rows and changed != want
    mirror.sql("UPDATE t SET s = 'row 1', at = at + interval '1 microsecond' WHERE id = 1")
    assert pg_checksum(mirror.dsn, "public.t") != want


def test_demo_is_quiet_and_ends_with_a_verdict(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkapply",
            "demo",
            "--config",
            "configs/local.toml",
            "--rows",
            "30000",
        ],
        cwd=REPO,
        env={**os.environ, "SPARKAPPLY_WORK_DIR": str(work)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    screen = proc.stdout + proc.stderr
    assert proc.returncode == 0, screen[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("OK: all 3 tables identical"), proc.stdout
    for table in ("shop.customers", "shop.orders", "shop.events"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(table))
        assert line.endswith(" yes"), line
    # Spark's noise is in the log file, not on the screen.
    for noise in ("NativeCodeLoader", "incubator modules", "log4j", "Setting default log level"):
        assert noise not in screen, noise
    spark_log = (work / "logs" / "spark.log").read_text()
    assert "incubator modules" in spark_log
