"""Freshness at fixed pgbench rates: commit on the publisher to durable at the consumer.

    python bench/fresh_bench.py [--rates 300,1000,2000] [--duration 60] [--clients 4]
                                [--scale 1] [--mode apart|together] [--interval 0.01]
                                [--no-maintenance] [--native-synchronous-commit on|off]
                                [--log-dir DIR] [--out PATH] [--allow-dirty]

One live ``sparkapply run --config F`` (the default config, as in ``race_bench.py``)
and one native subscription (``streaming = parallel``), both on pgbench's tables
(``pgbench -i -s --scale``: copied by each, then warmed by a few transactions), at the
same durability (neither fsyncs). For each rate, ``pgbench -c --clients -R <rate> -T
--duration`` runs on the publisher while the publisher is sampled every ``--interval``
seconds: its WAL written (``pg_current_wal_lsn()``) and each live consumer's slot
``confirmed_flush_lsn``. A WAL position's lag is the time the consumer confirmed it
minus the time it was written; reported: p50, p95 and max over the load, and the tail
(the load's end until the consumer has everything written by then).

``--mode apart`` (the default): one consumer live at a time, each with the machine to
itself under the same load (the other is frozen or disabled; before its turn a
consumer catches up, untimed); the order alternates between rates. ``--mode
together``: both live during one pgbench run per rate. Results go to
``bench/results/fresh.json``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from benchlib import applog, freshness, pgbench
from benchlib.cli import bench_parser, exit_on_sigterm, parse_bench_args
from benchlib.live import (
    SPARK_MASTER,
    LiveConsumer,
    NativeSubscription,
    SlotWatch,
    SparkapplyProcess,
    cleanup,
    live_settings,
)
from benchlib.metering import loadavg, tree_cpu, wait_quiet
from benchlib.report import columns, log, machine, print_table
from benchlib.servers import (
    LIVE_PUBLISHER,
    LIVE_SUBSCRIBER,
    PUBLICATION,
    postmaster_pid,
    scratch,
    server,
)

from sparkapply.embedded import EmbeddedPostgres
from sparkapply.state.batch_log import read_batch_log


@dataclass(frozen=True, slots=True)
class Setup:
    """The publisher and both consumers: by name, with the root process of each one's
    CPU, and sparkapply's process."""

    pub: EmbeddedPostgres
    consumers: dict[str, LiveConsumer]
    roots: dict[str, int]
    sa: SparkapplyProcess


def measure(
    setup: Setup, names: tuple[str, ...], args: argparse.Namespace, rate: int
) -> dict[str, Any]:
    """One pgbench run at ``rate`` with the consumers ``names`` live; each one's lags."""
    pub, roots, sa = setup.pub, setup.roots, setup.sa
    live = {n: setup.consumers[n] for n in names}
    slots = {name: c.slot for name, c in live.items()}
    with (
        SlotWatch(pub.dsn()) as watch,
        freshness.LsnSampler(pub.dsn(), list(slots.values()), args.interval) as sampler,
    ):
        time.sleep(0.5)  # a few samples before the load
        load = loadavg()
        cpu_before = {name: tree_cpu(root) for name, root in roots.items()}
        wall_start, start = time.time(), time.monotonic()
        output = pgbench.run(
            pub, "-n", "-c", str(args.clients), "-R", str(rate), "-T", str(args.duration)
        )
        end = time.monotonic()
        cpu = {name: round(tree_cpu(root) - cpu_before[name], 2) for name, root in roots.items()}
        end_lsn = watch.written_lsn()
        for name, consumer in live.items():
            watch.wait(
                consumer.slot,
                end_lsn,
                timeout=args.tail_timeout,
                check=consumer.check,
                what=f"{name} after the load",
            )
        time.sleep(3 * args.interval)  # the sample that saw it is in
        wall_end = time.time()
    s = sampler.samples
    window = [t for t in s.times if start <= t <= end]
    runs: dict[str, Any] = {}
    for name, slot in slots.items():
        values = freshness.lags(s.times, s.written, s.durable[slot], start, end)
        runs[name] = {
            **freshness.summary(values),
            "tail": _round(freshness.tail(s.times, s.durable[slot], end, end_lsn)),
            "lag_max_by_second": freshness.per_second_max(window, values, start),
        }
        if name == "sparkapply":
            runs[name]["log"] = _log_summary(sa, wall_start, wall_end)
    return {
        "rate": rate,
        "duration": args.duration,
        "live": list(live),
        "load_before": round(load, 2),
        "pgbench": pgbench.figures(output),
        "cpu_seconds_during_load": cpu,
        "samples": len(window),
        "consumers": runs,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _log_summary(sa: SparkapplyProcess, since: float, until: float) -> dict[str, Any]:
    """sparkapply's batches during a run, from its log."""
    try:
        text = sa.log_path.read_text(errors="replace")
    except OSError:
        return {}
    records = read_batch_log(sa.work_dir, since)
    tl = applog.timeline(applog.parse_log(text), records, since, until)
    batches = tl["batches"]
    secs = [b["seconds"] for b in batches]
    return {
        "batches": len(batches),
        "batch_seconds_median": round(statistics.median(secs), 3) if secs else None,
        "batch_seconds_max": round(max(secs), 3) if secs else None,
        "transactions_per_batch_median": (
            statistics.median(b["transactions"] for b in batches) if batches else None
        ),
        "apply_thread_busy_seconds": tl["batch_seconds"],
        "other": tl["other"][:40],
    }


def prepare_live(
    pub: EmbeddedPostgres,
    consumers: dict[str, LiveConsumer],
    live: tuple[str, ...],
    sa: SparkapplyProcess,
    timeout: float,
) -> None:
    """Vacuum pgbench's tables (autovacuum is off: each turn starts from the same
    state), pause the others, resume ``live``, wait until they are caught up and
    idle."""
    with psycopg.connect(pub.dsn(), autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {', '.join(pgbench.TABLES)}")
    for name, consumer in consumers.items():
        if name not in live:
            consumer.pause()
    for name in live:
        consumers[name].resume()
    with SlotWatch(pub.dsn()) as watch:
        target = watch.insert_lsn()
        for name in live:
            c = consumers[name]
            watch.wait(c.slot, target, timeout=timeout, check=c.check, what=f"{name} catch-up")
    if "sparkapply" in live:
        wait_quiet(sa.pid)


def print_report(results: list[dict[str, Any]]) -> None:
    table = columns(
        "rate:>6|tps:>8.0f|  consumer:<14|p50 s:>7.3f|p95 s:>7.3f|max s:>7.3f|tail s:>7.3f"
        "|batches:>8"
    )
    rows = []
    for r in results:
        for name, c in r["consumers"].items():
            batches = c.get("log", {}).get("batches", "")
            nums = [c[k] if c[k] is not None else float("nan") for k in ("p50", "p95", "max")]
            tail = c["tail"] if c["tail"] is not None else float("nan")
            rows.append(
                (r["rate"], r["pgbench"].get("tps", 0.0), f"  {name}", *nums, tail, batches)
            )
    print_table(table, rows)


def turns_of(mode: str, k: int) -> list[tuple[str, ...]]:
    """Which consumers are live, turn by turn, at the ``k``-th rate: both at once, or
    one at a time in an order that alternates between rates."""
    if mode == "together":
        return [("native", "sparkapply")]
    turns: list[tuple[str, ...]] = [("native",), ("sparkapply",)]
    if k % 2 == 1:
        turns.reverse()
    return turns


def measure_rate(setup: Setup, args: argparse.Namespace, rate: int, k: int) -> list[dict[str, Any]]:
    """Every turn at the ``k``-th rate: each one's consumers made live, then measured."""
    results = []
    for live in turns_of(args.mode, k):
        prepare_live(setup.pub, setup.consumers, live, setup.sa, args.tail_timeout * 4)
        log(f"rate {rate}: {' and '.join(live)} live; pgbench for {args.duration}s")
        r = measure(setup, live, args, rate)
        for name, c in r["consumers"].items():
            log(
                f"rate {rate} {name}: p50 {c['p50']} p95 {c['p95']} max {c['max']}"
                f" tail {c['tail']} (pgbench tps {r['pgbench'].get('tps')})"
            )
        results.append(r)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--rates", default="300,1000,2000", help="pgbench -R, comma-separated")
    parser.add_argument("--duration", type=int, default=60, help="pgbench -T (s)")
    parser.add_argument("--clients", type=int, default=4, help="pgbench -c")
    parser.add_argument("--scale", type=int, default=1, help="pgbench -i -s")
    parser.add_argument("--mode", choices=("apart", "together"), default="apart")
    parser.add_argument("--interval", type=float, default=0.01, help="sampling (s)")
    parser.add_argument("--tail-timeout", type=float, default=300.0)
    parser.add_argument("--no-maintenance", action="store_true")
    parser.add_argument("--native-synchronous-commit", choices=("on", "off"), default="on")
    parser.add_argument("--log-dir", type=Path, help="keep sparkapply's log here")
    args, output = parse_bench_args(parser, argv, "fresh.json")
    rates = [int(r) for r in args.rates.split(",") if r.strip()]
    logging.basicConfig(level=logging.WARNING)
    exit_on_sigterm()
    results: list[dict[str, Any]] = []
    with (
        scratch("sparkapply-fresh-") as tmp,
        server(tmp / "pub", LIVE_PUBLISHER) as pub,
        server(tmp / "sub", LIVE_SUBSCRIBER) as sub,
    ):
        pgbench.init(pub, args.scale)
        with psycopg.connect(pub.dsn(), autocommit=True) as conn:
            tables = ", ".join(pgbench.TABLES)
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {tables}")
        pgbench.init(sub, args.scale, steps="dtp")
        sa = SparkapplyProcess(
            tmp / "sparkapply", pub, "sparkapply_fresh", maintenance=not args.no_maintenance
        )
        native = NativeSubscription(
            pub, sub, "native_fresh", synchronous_commit=args.native_synchronous_commit
        )
        consumers: dict[str, LiveConsumer] = {"native": native, "sparkapply": sa}
        try:
            sa.start()
            native.create()
            native.wait_ready()
            with SlotWatch(pub.dsn()) as watch:
                watch.wait_slot(sa.slot, timeout=1800, check=sa.check)
            pgbench.run(pub, "-n", "-c", "1", "-t", "10")  # warm-up: a few small batches
            roots = {"native": postmaster_pid(sub), "sparkapply": sa.pid}
            setup = Setup(pub, consumers, roots, sa)
            for k, rate in enumerate(rates):
                results += measure_rate(setup, args, rate, k)
        finally:

            def keep_log() -> None:
                if args.log_dir is not None and sa.log_path.exists():
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(sa.log_path, args.log_dir / "fresh_sparkapply.log")

            def drop_slot() -> None:
                with SlotWatch(pub.dsn()) as watch:
                    watch.drop_slot(sa.slot)

            cleanup(sa.stop, keep_log, native.close, drop_slot)

    print_report(results)
    output.write(
        {
            "benchmark": "fresh_bench",
            "rates": rates,
            "duration": args.duration,
            "clients": args.clients,
            "scale": args.scale,
            "mode": args.mode,
            "interval": args.interval,
            "machine": machine(SPARK_MASTER),
            "settings": live_settings(
                args.native_synchronous_commit, maintenance=not args.no_maintenance
            ),
            "results": results,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
