"""``--profile``: one more sparkapply run under cProfile, on the driver and in the tasks.

The receiving thread (the caller of ``run()``) is profiled in this process; the Spark
tasks by Spark's own Python profiler (``spark.python.profile``), which needs a
session of its own: the timed runs' session is stopped first, so its profiler costs
them nothing. cProfile roughly doubles Python-heavy code: read it for proportions,
and the phases of the timed runs for seconds.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path
from typing import Any

from benchlib.report import log
from benchlib.sparkapply_runs import PROFILE_CONF, Sparkapply, start_spark
from benchlib.workloads import Backlog
from sparkapply.embedded import EmbeddedPostgres


def top_functions(stats: pstats.Stats, n: int = 18) -> list[dict[str, Any]]:
    rows = []
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(file).name}:{line}({func})",
                "calls": ncalls,
                "tottime": round(tottime, 3),
                "cumtime": round(cumtime, 3),
            }
        )
    rows.sort(key=lambda r: -r["tottime"])
    return rows[:n]


def stats_text(stats: pstats.Stats, sort: str, n: int) -> str:
    buf = io.StringIO()
    stats.stream = buf  # type: ignore[attr-defined]
    stats.sort_stats(sort).print_stats(n)
    return buf.getvalue()


def profile_run(
    pub: EmbeddedPostgres, root: Path, slot: str, backlog: Backlog, out_dir: Path | None
) -> dict[str, Any]:
    """A run on the primed ``slot``, profiled; the JSON's ``profile`` section."""
    spark, startup, _ = start_spark("sparkapply-apply-bench-profile", PROFILE_CONF)
    try:
        dumps = root / "executor-profiles"
        spark.sparkContext.dump_profiles(str(root / "warm-up-profiles"))  # and forgets them
        consumer = Sparkapply(spark, pub, root, [slot], streamed=True)
        driver = consumer.profile = cProfile.Profile()
        run = consumer.run(backlog)
        spark.sparkContext.dump_profiles(str(dumps))
    finally:
        spark.stop()
    log(f"profile (cProfile): {run.seconds:.2f}s (profiled session started in {startup:.1f}s)")
    driver_stats = pstats.Stats(driver)
    files = sorted(str(p) for p in dumps.glob("*.pstats"))
    exec_stats = pstats.Stats(*files) if files else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        driver_stats.dump_stats(str(out_dir / "driver.pstats"))
        (out_dir / "driver.txt").write_text(stats_text(driver_stats, "cumulative", 40))
        if exec_stats is not None:
            exec_stats.dump_stats(str(out_dir / "executor.pstats"))
            (out_dir / "executor.txt").write_text(
                stats_text(exec_stats, "tottime", 40) + stats_text(exec_stats, "cumulative", 40)
            )
        log(f"profiles written to {out_dir}")
    return {
        "cprofile_run": {
            "seconds": round(run.seconds, 3),
            "driver_phases": {k: round(v, 3) for k, v in run.phases.items()},
            "executor_phases": run.detail["executor_phases"],
            "driver_receive_thread_top": top_functions(driver_stats),
            "executor_task_top": top_functions(exec_stats) if exec_stats else [],
        }
    }


def print_profile(profile: dict[str, Any]) -> None:
    c = profile["cprofile_run"]
    print(f"\ncProfile run: {c['seconds']:.2f}s (cProfile inflates Python-heavy code)")
    for title, key in (
        ("driver receiving thread", "driver_receive_thread_top"),
        ("executor task", "executor_task_top"),
    ):
        print(f"  top of {title} by own time:")
        for row in c[key][:12]:
            print(
                f"    {row['tottime']:>7.2f}s own {row['cumtime']:>7.2f}s cum "
                f"{row['calls']:>10,}  {row['function']}"
            )
