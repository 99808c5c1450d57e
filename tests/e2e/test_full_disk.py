"""A work_dir whose disk fills while a large streamed transaction spools: ``run`` stops
with exit 2 naming the path and the space, having acknowledged only what is durable,
and after space is freed the next ``run`` goes on exactly.

The work_dir is a small tmpfs the test mounts (the tests run as root, as CI does); the
catalog and the warehouse are elsewhere, as on a machine whose spool disk is its own.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sparkapply.config import load_config
from sparkapply.lsn import Lsn
from tests.mirror import Mirror, cli

pytestmark = pytest.mark.integration


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "work"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _config(path: Path, work: Path, dsn: str, slot: str, root: Path) -> Path:
    path.write_text(
        f'work_dir = "{work}"\n'
        f'[source]\ndsn = "{dsn}"\npublication = "pub"\nslot = "{slot}"\n'
        f'[sink.catalog]\ntype = "sql"\nuri = "sqlite:///{root}/catalog.db"\n'
        f'warehouse = "file://{root}/warehouse"\n'
        '[spark]\nmaster = "local[1]"\n[maintenance]\nenabled = false\n'
    )
    return path


def _confirmed(dsn: str, slot: str) -> Lsn:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def test_a_full_work_dir_stops_with_exit_2_and_resumes_exactly(
    pg_dsn: str, tmp_path: Path, small_disk: Path, spark: Any
) -> None:
    mirror = Mirror(pg_dsn, small_disk, spark)
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, pad text)",
        "INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 100) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    cfg = _config(tmp_path / "c.toml", small_disk, pg_dsn, mirror.slot, tmp_path)
    mirror.config = load_config(cfg, env={})
    mirror.run()
    mirror.sql("UPDATE t SET pad = 'small' WHERE id <= 10")
    # About 12 MB streamed in chunks (the test server decodes with 64kB of memory).
    mirror.sql("INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(101, 12100) g")
    durable_before = mirror.insert_lsn()

    full = cli("run", "--config", str(cfg), "--until-caught-up")
    assert full.returncode == 2, full.stderr[-3000:]
    assert f"no space left for {small_disk}/" in full.stderr, full.stderr[-3000:]
    assert "bytes free" in full.stderr and "HINT: free space" in full.stderr
    assert "Traceback" not in full.stderr
    # Nothing of the large transaction was acknowledged.
    assert _confirmed(pg_dsn, mirror.slot) < durable_before

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    mirror.run()
    assert _confirmed(pg_dsn, mirror.slot) >= durable_before
    mirror.assert_mirrored("public.t")
