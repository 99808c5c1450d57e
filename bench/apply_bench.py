"""Apply throughput: sparkapply beside PostgreSQL's own subscriber and pg_recvlogical.

    python bench/apply_bench.py [--workload bulk|mixed|update|scatter] [--rows 1000000]
                                [--repeat 3] [--replica-identity default|full]
                                [--profile] [--profile-dir DIR]
                                [--out PATH] [--allow-dirty]

Starts two bundled PostgreSQL 16 servers in a temporary directory, a publisher and a
native subscriber (``wal_level=logical``, ``logical_decoding_work_mem=64MB``), creates
``orders (id bigint primary key, customer int, amount numeric(12,2), status text,
created_at timestamptz, note text)`` on both, one publication, and, before any row is
written, every consumer, one per round: a slot for ``pg_recvlogical``; a disabled
native subscription (``copy_data = false, streaming = parallel, create_slot = true,
enabled = false``); and for sparkapply a first ``run(until_caught_up=True)`` on the
empty table, which creates its slot, work dir and Iceberg table (and records the
empty initial copy) as a user who started it before the load would have. Then the
backlog is written once, with every consumer stopped:

``bulk``   ``--rows`` rows inserted in ONE transaction (streamed by the server, since
           it passes logical_decoding_work_mem);
``mixed``  the same rows in transactions of 1,000 inserts; after every 10,000 rows one
           transaction updates 10% of them and one deletes 5% of them;
``update`` ONE transaction updating every row of a table prefilled with ``--rows`` rows;
``scatter`` ``--updates`` (20,000) single-row update transactions on random rows of a
           table prefilled with ``--rows`` rows.

For ``update`` and ``scatter`` the table is filled before any consumer exists: the
native subscriber's copy is filled with the same rows (and refilled before each round,
untimed), and each sparkapply run's table is its own initial copy, made when it was
primed.

and ends with a non-transactional logical message whose LSN is ``pg_recvlogical``'s
``--endpos``. The consumers then drain the SAME backlog one after another (never two
at a time: the machine has 2 cores), round-robin over ``--repeat`` rounds:

(a) ``pg_recvlogical`` on its slot, with the options sparkapply negotiates, to
    /dev/null up to ``--endpos``: the server's decode-and-send rate, the bound.
(b) the native subscription, from ``ALTER SUBSCRIPTION ... ENABLE`` until its slot's
    ``confirmed_flush_lsn`` on the publisher reaches the target (the WAL insert
    position after the backlog); then disabled, and the subscriber's table emptied
    for the next round.
(c) sparkapply: ``Subscriber(config, spark=session).run(until_caught_up=True)`` on
    that round's work dir and SQLite catalog, ``local[2]``. The Spark session (and one warm-up job
    that starts the Python workers) is created once, before, and reported apart.

Every run is verified: count, sum(id) and sum(amount) of the consumer's copy equal
the publisher's, and sparkapply applied every change from the stream. Prints seconds,
row changes per second and CPU seconds (consumer, publisher) for each consumer (best
of ``--repeat``, with every run so the noise is visible), the rate ratios
sparkapply/native and sparkapply/pg_recvlogical, and sparkapply's phases (setup,
receive and spool, planning, Spark job, Iceberg commit, tail) and its tasks' phases,
from the timings the package records (``BatchStats``, ``TableResult.timings``). The
figures go to ``bench/results/apply_<workload>_<rows>.json`` (refused from a dirty
tree without ``--allow-dirty``).

``--replica-identity full`` sets ``REPLICA IDENTITY FULL`` on the publisher's table
(the native subscriber still finds rows by its primary key; sparkapply, which sees
only the identity the stream sends, takes its row-wise path for such a table); the
figures go to ``apply_<workload>_<rows>_full.json``.

``--profile`` adds one sparkapply run after the timed ones, under cProfile (receiving
thread on the driver, and the Spark tasks through Spark's Python profiler). See
bench/README.md.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from benchlib.cli import bench_parser, parse_bench_args
from benchlib.consumers import Consumer, NativeSubscription, PgRecvLogical, Results
from benchlib.profiling import print_profile, profile_run
from benchlib.report import columns, log, machine, print_table
from benchlib.servers import SETTINGS, SUBSCRIBER_SETTINGS, publish, scratch, server
from benchlib.sparkapply_runs import SPARK_MASTER, Sparkapply, start_spark
from benchlib.workloads import (
    ORDERS,
    ORDERS_DDL,
    PREFILLED,
    WORKLOADS,
    Backlog,
    describe,
    prefill,
    write_backlog,
)

from sparkapply.embedded import EmbeddedPostgres

PROFILE_SLOT = "sparkapply_cprofile"


def print_report(
    backlog: Backlog, results: Sequence[Results], spark_times: tuple[float, float], repeat: int
) -> dict[str, float]:
    changes = backlog.changes
    print(f"workload {backlog.workload}: {describe(backlog)}")
    print(
        f"{changes:,} row changes, {backlog.wal_bytes / 1e6:.1f} MB of WAL; "
        f"best of {repeat}, one consumer at a time"
    )
    table = columns(
        "consumer:<28|seconds:>8.2f|rows/s:>10,.0f|CPU s:>7.1f|pub CPU:>8.1f"
        "|   all runs (s):<24|spread:>6.0%"
    )
    rows = []
    for c in results:
        b = c.best
        runs = "   " + " ".join(f"{r.seconds:.2f}" for r in c.runs)
        cpu = (b.cpu.get("consumer", 0.0), b.cpu.get("publisher", 0.0))
        rows.append((c.name, b.seconds, changes / b.seconds, *cpu, runs, c.spread))
    print_table(table, rows)
    recv, native, sa = (c.best.seconds for c in results)
    ratios = {"sparkapply/native": native / sa, "sparkapply/pg_recvlogical": recv / sa}
    for name, seconds in (("native", native), ("pg_recvlogical", recv)):
        print(
            f"rate ratio sparkapply/{name}: {ratios[f'sparkapply/{name}']:.2f}"
            f" (sparkapply takes {sa / seconds:.1f}x as long)"
        )
    best = results[2].best
    if "receive" in best.phases:
        print(
            "sparkapply best run, wall s: "
            + ", ".join(f"{k} {v:.2f}" for k, v in best.phases.items() if k != "total")
        )
        print(
            "  task phases, task s: "
            + ", ".join(f"{k} {v:.2f}" for k, v in best.detail["executor_phases"].items())
        )
        receive_cpu = best.detail.get("receive_thread_cpu_seconds")
        if receive_cpu is not None:
            per_msg = receive_cpu / max(best.detail["changes"], 1) * 1e6
            print(
                f"  receiving thread CPU during receive: {receive_cpu:.2f}s"
                f" ({per_msg:.2f} us per change)"
            )
        print(
            f"  rows staged while the transaction arrived: {best.detail['staged_rows']:,};"
            f" driver peak RSS: {best.detail['driver_peak_rss_mib']} MiB"
        )
    print(
        f"Spark session startup (not in the times above): {spark_times[0]:.1f}s,"
        f" + {spark_times[1]:.1f}s warm-up job"
    )
    print(
        "CPU s: the consumer's processes (pg_recvlogical; the subscriber cluster;"
        " driver + JVM + Python workers); pub CPU: the publisher cluster"
    )
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--workload", choices=WORKLOADS, default="bulk")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=20_000, help="scatter: transactions")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per native run")
    parser.add_argument("--replica-identity", choices=("default", "full"), default="default")
    parser.add_argument("--profile", action="store_true", help="one more run, under cProfile")
    parser.add_argument("--profile-dir", type=Path, help="write .pstats and .txt here")
    args, output = parse_bench_args(parser, argv, "apply_<workload>_<rows>.json", _result_name)
    logging.basicConfig(level=logging.WARNING)

    spark, spark_startup, spark_warmup = start_spark("sparkapply-apply-bench")
    log(f"Spark session {spark_startup:.1f}s, warm-up job {spark_warmup:.1f}s")
    backlog, results, profile = measure(args, spark)

    ratios = print_report(backlog, results, (spark_startup, spark_warmup), args.repeat)
    if profile is not None:
        print_profile(profile)
    report: dict[str, Any] = {
        "benchmark": "apply_bench",
        "workload": args.workload,
        "rows": args.rows,
        "replica_identity": args.replica_identity,
        "repeat": args.repeat,
        "machine": machine(SPARK_MASTER),
        "settings": SETTINGS,
        "backlog": backlog.as_json(),
        "spark_session_startup_seconds": round(spark_startup, 3),
        "spark_warmup_job_seconds": round(spark_warmup, 3),
        "consumers": {c.name: c.summary(backlog.changes) for c in results},
        "rate_ratios": {k: round(v, 3) for k, v in ratios.items()},
    }
    if profile is not None:
        report["profile"] = profile
    output.write(report)
    return 0


def _result_name(args: argparse.Namespace) -> str:
    suffix = "_full" if args.replica_identity == "full" else ""
    return f"apply_{args.workload}_{args.rows}{suffix}.json"


def measure(
    args: argparse.Namespace, spark: Any
) -> tuple[Backlog, list[Results], dict[str, Any] | None]:
    """Both servers, every consumer prepared, the backlog written once, then drained by
    each consumer in turn for ``--repeat`` rounds (and once more under cProfile)."""
    repeat = args.repeat
    profile: dict[str, Any] | None = None
    with (
        scratch("sparkapply-apply-bench-") as tmp,
        server(tmp / "pub", SETTINGS) as pub,
        server(tmp / "sub", SUBSCRIBER_SETTINGS) as sub,
    ):
        try:
            consumers = prepare_consumers(args, spark, pub, sub, tmp)
            backlog = write_backlog(pub.dsn(), args.workload, args.rows, args.updates)
            log(
                f"backlog: {backlog.changes:,} changes in {backlog.transactions:,}"
                f" transactions, {backlog.wal_bytes / 1e6:.1f} MB of WAL, written in"
                f" {backlog.seconds:.1f}s (endpos {backlog.endpos}, target {backlog.target})"
            )
            results = [Results(c.name) for c in consumers]
            for i in range(repeat):  # round-robin: a burst of load hits every consumer
                for consumer, res in zip(consumers, results, strict=True):
                    r = consumer.run(backlog)
                    res.runs.append(r)
                    phases = ", ".join(f"{k} {v:.2f}" for k, v in r.phases.items() if k != "total")
                    log(
                        f"round {i + 1}: {consumer.name} {r.seconds:.2f}s"
                        f" (load {r.load_before:.2f}){'; ' + phases if phases else ''}"
                    )
        finally:
            spark.stop()
        if args.profile:
            profile = profile_run(pub, tmp, PROFILE_SLOT, backlog, args.profile_dir)
    return backlog, results, profile


def prepare_consumers(
    args: argparse.Namespace,
    spark: Any,
    pub: EmbeddedPostgres,
    sub: EmbeddedPostgres,
    tmp: Path,
) -> list[Consumer]:
    """The table on both servers (prefilled for update and scatter), the publication,
    and every consumer made ready before any row of the backlog is written."""
    repeat = args.repeat
    publish(pub.dsn(), ORDERS_DDL, ORDERS)
    if args.replica_identity == "full":
        with psycopg.connect(pub.dsn(), autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {ORDERS} REPLICA IDENTITY FULL")
    with psycopg.connect(sub.dsn(), autocommit=True) as conn:
        conn.execute(ORDERS_DDL)
    prefilled = args.rows if args.workload in PREFILLED else 0
    if prefilled:
        prefill(pub.dsn(), prefilled)
    slots = [f"sparkapply_{i}" for i in range(repeat)]
    consumers: list[Consumer] = [
        PgRecvLogical(pub, repeat),
        NativeSubscription(pub, sub, repeat, timeout=args.timeout, prefilled=prefilled),
        Sparkapply(spark, pub, tmp, slots, streamed=True),
    ]
    if args.profile:
        Sparkapply(spark, pub, tmp, [PROFILE_SLOT], streamed=True).prepare()
    for consumer in consumers:
        consumer.prepare()
    return consumers


if __name__ == "__main__":
    raise SystemExit(main())
