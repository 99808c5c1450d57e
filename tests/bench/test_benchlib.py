"""The benchmarks' library: dirty-tree refusal, /proc metering, phases and tables."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from benchlib.metering import CpuMeter, ThreadCpuSampler, loadavg
from benchlib.report import Output, print_table, uncommitted
from benchlib.sparkapply_runs import executor_phases, phases

from sparkapply.apply.batch import BatchStats
from sparkapply.apply.tasks import TableResult


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=b", "-c", "user.email=b@x", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for path in ("sparkapply/a.py", "bench/b.py", "bench/results/old.json", "README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "start")
    return tmp_path


def test_results_are_refused_from_a_dirty_tree(repo: Path) -> None:
    (repo / "README.md").write_text("not watched\n")
    (repo / "bench/results/old.json").write_text("a result being rewritten\n")
    assert uncommitted(repo) == []
    clean = Output.from_args(None, "r.json", False, repo=repo)
    assert clean.path == repo / "bench/results/r.json"

    (repo / "sparkapply/a.py").write_text("changed\n")
    (repo / "bench/new.py").write_text("untracked\n")
    assert uncommitted(repo) == ["bench/new.py", "sparkapply/a.py"]
    with pytest.raises(SystemExit, match=r"uncommitted changes.*sparkapply/a\.py"):
        Output.from_args(None, "r.json", False, repo=repo)

    allowed = Output.from_args(None, "r.json", True, repo=repo)
    allowed.write({"benchmark": "t"})
    written = json.loads((repo / "bench/results/r.json").read_text())
    assert written["code"]["allow_dirty"] is True
    assert written["code"]["uncommitted"] == ["bench/new.py", "sparkapply/a.py"]

    elsewhere = Output.from_args(repo / "out", "r.json", False, repo=repo)  # not results/
    assert elsewhere.path == repo / "out"
    (repo / "tmp").mkdir()
    assert Output.from_args(repo / "tmp", "r.json", False, repo=repo).path == repo / "tmp/r.json"
    assert Output.from_args(None, "r.json", False, by_default=False, repo=repo).path is None


def _burn(cpu_seconds: float) -> None:
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


def test_cpu_of_this_process_tree() -> None:
    started = time.monotonic()
    with CpuMeter(os.getpid(), os.getpid()) as meter:
        _burn(0.3)
    wall = time.monotonic() - started
    assert 0.25 <= meter.consumer <= wall * (os.cpu_count() or 1) + 0.05
    assert meter.as_dict()["publisher"] == round(meter.publisher, 2)
    assert loadavg() >= 0


def test_thread_cpu_between_two_instants() -> None:
    with ThreadCpuSampler(threading.current_thread(), interval=0.005) as sampler:
        t0 = time.monotonic()
        _burn(0.2)
        t1 = time.monotonic()
        time.sleep(0.1)
        t2 = time.monotonic()
    assert 0.15 <= sampler.between(t0, t1) <= 0.25
    assert sampler.between(t1, t2) <= 0.03


def test_phases_add_up_to_the_run() -> None:
    def batch(start: float, end: float) -> BatchStats:
        result = TableResult("public.t", seconds=0.5, timings={"fold": 0.3, "write": 0.1})
        return BatchStats(
            plan_seconds=0.1,
            job_seconds=0.5,
            commit_seconds=0.2,
            started=start,
            finished=end,
            results=[result],
        )

    batches = [batch(12.0, 13.0), batch(13.5, 14.5)]
    p = phases(10.0, 15.0, 11.0, batches)
    assert p["setup"] == 1.0 and p["receive"] == 1.0 and p["tail"] == 0.5
    assert p["receive_overlapped"] == 0.5 and p["spark_job"] == 1.0
    assert sum(v for k, v in p.items() if k != "total") == pytest.approx(p["total"])
    assert executor_phases(batches) == {"fold": 0.6, "write": 0.2, "task": 1.0}
    assert phases(10.0, 15.0, 0.0, []) == {"total": 5.0}
    assert phases(10.0, 15.0, 14.0, []) == {"total": 5.0, "setup": 4.0, "tail": 1.0}


def test_table_heads_take_the_columns_alignment(capsys: pytest.CaptureFixture[str]) -> None:
    print_table([("name", "<6"), ("seconds", ">8.2f")], [("a", 1.5), ("bb", 12.25)])
    assert capsys.readouterr().out.splitlines() == [
        "name   seconds",
        "a         1.50",
        "bb       12.25",
    ]
