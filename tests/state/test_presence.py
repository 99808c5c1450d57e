"""A run's presence on a work_dir (state/presence.py): held while it lives, gone when
it ends, also by SIGKILL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkapply.state.presence import living, run_alive


def test_held_while_a_run_lives(tmp_path: Path) -> None:
    work = tmp_path / "work"
    assert not run_alive(work)
    with living(work):
        assert run_alive(work)
        with living(work):  # a second run is not kept out here (the slot refuses it)
            assert run_alive(work)
    assert not run_alive(work)


def test_gone_with_a_killed_process(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from sparkapply.state.presence import living\n"
            f"with living(Path({str(tmp_path)!r})):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        assert run_alive(tmp_path)
    finally:
        child.kill()
        child.wait(30)
    assert not run_alive(tmp_path)
