"""``sparkapply demo`` as a user sees it, ending with ``sparkapply verify``'s verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


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
        assert " match " in line and line.split()[1] == line.split()[2], line  # rows equal
    # Spark's noise is in the log file, not on the screen.
    for noise in ("NativeCodeLoader", "incubator modules", "log4j", "Setting default log level"):
        assert noise not in screen, noise
    spark_log = (work / "logs" / "spark.log").read_text()
    assert "incubator modules" in spark_log
