"""The benchmarks' library: dirty-tree refusal, /proc metering, phases and tables."""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from benchlib.applog import parse_log, split, timeline
from benchlib.freshness import lags, per_second_max, percentile, summary, tail
from benchlib.live import sparkapply_config_text
from benchlib.metering import CpuMeter, ThreadCpuSampler, descendants, loadavg, process_tree
from benchlib.pgbench import figures
from benchlib.race import order_of
from benchlib.report import Output, print_table, uncommitted
from benchlib.sparkapply_runs import executor_phases, phases

from sparkapply.apply.tasks import TableResult
from sparkapply.run.batch import BatchStats


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


# -- the live benchmarks' pure helpers (race_bench.py, fresh_bench.py) ----------------


def test_a_process_tree_is_found_by_parent_links() -> None:
    parent = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 21: 20}
    assert descendants(parent, 10) == [10, 11, 12, 13]
    assert descendants(parent, 13) == [13]
    assert descendants(parent, 99) == [99]  # gone: the caller filters by liveness
    assert process_tree(os.getpid())[0] == os.getpid()


def test_lag_is_the_time_from_written_to_durable() -> None:
    times = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05]
    written = [100, 200, 300, 300, 400, 400]
    durable = [100, 100, 200, 300, 300, 400]
    # sample 0: 100 already durable; 1: 200 durable at 0.02; 2 and 3: 300 at 0.03;
    # 4: 400 at 0.05; sample 5 is outside the window.
    got = lags(times, written, durable, 0.0, 0.04)
    assert got == pytest.approx([0.0, 0.01, 0.01, 0.0, 0.01])
    # Never before its own sample, even if the position was durable earlier.
    assert lags([0.0, 1.0], [50, 50], [60, 60], 1.0, 1.0) == [0.0]
    assert lags(times, written, [100] * 6, 0.0, 0.05)[1:] == [None] * 5
    s = summary([0.5, None, 1.5, 1.0])
    assert s == {"samples": 4, "unresolved": 1, "p50": 1.0, "p95": 1.45, "max": 1.5}
    assert summary([])["p50"] is None


def test_tail_and_percentiles() -> None:
    times = [0.0, 1.0, 2.0, 3.0]
    durable = [10, 20, 30, 40]
    assert tail(times, durable, 1.5, 30) == pytest.approx(0.5)
    assert tail(times, durable, 1.5, 20) == 0.5  # the first sample after the end
    assert tail(times, durable, 0.0, 10) == 0.0
    assert tail(times, durable, 1.5, 41) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    assert percentile([7.0], 95) == 7.0
    assert math.isnan(percentile([], 50))
    assert per_second_max([0.1, 0.5, 1.2, 2.9], [0.2, 0.4, None, 0.1], 0.0) == [0.4, None, 0.1]


LOG = """\
2026-11-24 11:12:39,029 INFO sparkapply.run.subscriber: applied 546 transactions (2184 changes) \
to 4 tables in 1.68s; flushed to 0/24271F0
2026-11-24 11:12:40,245 INFO sparkapply.maintain.maintainer: maintenance public.t: files 3->1
2026-11-24 11:12:40,544 INFO sparkapply.run.subscriber: applied 1 transactions (1000000 changes, \
966256 rows staged while they arrived) to 1 tables in 1.33s; flushed to 0/2428280; plan 0.10s \
job=0.85s
2026-11-24 11:12:41,000 ERROR sparkapply: it failed
Traceback (most recent call last):
  File "x.py", line 1
"""


def test_the_log_of_a_live_run_is_read_back(tmp_path: Path) -> None:
    from sparkapply.lsn import Lsn
    from sparkapply.state.batch_log import BatchLog, read_batch_log

    lines = parse_log(LOG)
    assert [line.level for line in lines] == ["INFO", "INFO", "INFO", "ERROR"]
    assert lines[3].message.endswith('File "x.py", line 1')  # continuation lines
    assert lines[1].at - lines[0].at == pytest.approx(1.216)
    # The batches' figures come from the product's record, not from the log's text.
    record = BatchLog(tmp_path)
    figures = {
        "transactions": 1,
        "changes": 1000000,
        "staged_rows": 966256,
        "tables": 1,
        "seconds": 1.33,
        "plan_seconds": 0.1,
        "job_seconds": 0.85,
        "commit_seconds": 0.2,
        "path": "job",
    }
    record.append(Lsn.parse("0/2428280"), **figures)
    (written,) = read_batch_log(tmp_path)
    since = written["at"] - 0.299
    tl = timeline(lines, read_batch_log(tmp_path), since=since)
    (batch,) = tl["batches"]
    assert batch["t"] == 0.299 and batch["flushed"] == "0/2428280"
    assert {k: batch[k] for k in figures} == figures
    assert tl["batch_seconds"] == 1.33
    # The log's lines but the batches' own: here none falls after `since`.
    tl = timeline(lines, [], since=lines[1].at, until=lines[2].at)
    assert tl["other"] == [
        {
            "t": 0.0,
            "level": "INFO",
            "logger": "sparkapply.maintain.maintainer",
            "message": "maintenance public.t: files 3->1",
        }
    ]
    batches = [{"t": 2.0, "seconds": 1.5}, {"t": 3.0, "seconds": 0.5}]
    assert split(batches, 3.2) == pytest.approx(
        {"before_first_batch": 0.5, "batches": 2.0, "between_batches": 0.5, "ack_to_publisher": 0.2}
    )
    assert split([], 1.0) is None


def test_the_race_runs_the_default_config(tmp_path: Path) -> None:
    from sparkapply.config import load_config

    text = sparkapply_config_text(tmp_path / "w", "host=127.0.0.1 port=5", "s1")
    (tmp_path / "c.toml").write_text(text)
    config = load_config(tmp_path / "c.toml", env={})
    assert config.spark.master == "local[2]" and dict(config.spark.conf) == {}
    assert config.maintenance.enabled and config.source.slot == "s1"
    assert config.catalog_properties()["uri"] == f"sqlite:///{tmp_path}/w/catalog.db"
    off = sparkapply_config_text(tmp_path / "w", "host=x", "s1", maintenance=False)
    (tmp_path / "off.toml").write_text(off)
    assert not load_config(tmp_path / "off.toml", env={}).maintenance.enabled
    assert order_of("alternate", 0) == ("sparkapply", "native")
    assert order_of("alternate", 1) == ("native", "sparkapply")
    assert order_of("native", 0) == ("native", "sparkapply")


def test_pgbench_output_is_read() -> None:
    out = (
        "number of transactions actually processed: 3026\n"
        "number of failed transactions: 0 (0.000%)\n"
        "latency average = 1.122 ms\n"
        "rate limit schedule lag: avg 0.153 (max 2.1) ms\n"
        "tps = 303.318562 (without initial connection time)\n"
    )
    assert figures(out) == {
        "transactions": 3026.0,
        "failed": 0.0,
        "latency_ms": 1.122,
        "schedule_lag_ms": 0.153,
        "tps": 303.318562,
    }
