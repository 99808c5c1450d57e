"""``sparkapply demo`` as a user sees it, ending with ``sparkapply verify``'s verdict,
and never touching a folder it did not make."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _users_mirror(folder: Path) -> dict[str, str]:
    """A folder shaped like a user's own work_dir; its files by path, hashed."""
    (folder / "spool").mkdir(parents=True)
    (folder / "prepared").mkdir()
    (folder / "catalog.db").write_bytes(b"SQLite format 3\x00" + bytes(range(256)))
    (folder / "spool" / "000001.spool").write_bytes(b"\x01" * 1000)
    (folder / "prepared" / "812.json").write_text('{"gid": "order-17"}')
    return _fingerprint(folder)


def _fingerprint(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else "dir"
        for p in sorted(folder.rglob("*"))
    }


def _demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkapply", "demo", *args],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if not k.startswith("SPARKAPPLY_")},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_demo_is_quiet_ends_with_a_verdict_and_leaves_a_users_work_dir_alone(
    tmp_path: Path,
) -> None:
    # The README tells users to start from a copy of configs/local.toml, whose work_dir
    # is .sparkapply: the demo, run twice beside it, must leave it byte-identical.
    users = tmp_path / ".sparkapply"
    before = _users_mirror(users)
    proc = _demo(tmp_path, "--rows", "30000")
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
    demo_dir = tmp_path / ".sparkapply-demo"
    spark_log = (demo_dir / "logs" / "spark.log").read_text()
    assert "incubator modules" in spark_log
    assert (demo_dir / "DEMO").is_file()
    # Again, with the global flag after the verb: the demo remakes its own folder.
    again = _demo(tmp_path, "--rows", "2000", "-v")
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert again.stdout.strip().splitlines()[-1].startswith("OK: all 3 tables identical")
    assert " DEBUG " in again.stderr  # -v after the verb took effect
    assert _fingerprint(users) == before


def test_demo_refuses_a_work_dir_it_did_not_make(tmp_path: Path) -> None:
    users = tmp_path / "mirror"
    before = _users_mirror(users)
    # As the README shows it: the script, with the flags after it.
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "demo.sh"), "--verbose", "--work-dir", str(users)],
        env={**os.environ, "BOOTSTRAP_PG_MATRIX": "0"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"the demo's work_dir {users} holds files the demo did not make" in proc.stderr
    assert "catalog.db" in proc.stderr and "--work-dir" in proc.stderr
    assert _fingerprint(users) == before
