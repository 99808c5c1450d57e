"""Initial-copy throughput: sparkapply beside PostgreSQL's own subscriber (copy_data = true).

    python bench/copy_bench.py [--rows 5000000] [--repeat 1] [--native-first]
                               [--out PATH] [--allow-dirty]

Starts two bundled PostgreSQL 16 servers in a temporary directory, a publisher and a
native subscriber (the normal settings of ``sparkapply.embedded``), creates
``bench (id bigint primary key, a int, b text, c timestamptz, d numeric(12,2))`` (the
decode benchmark's rows) on the publisher and loads ``--rows`` rows, then
``VACUUM (FREEZE, ANALYZE)``, so neither consumer pays for setting hint bits after the
load and both see the same statistics, and reads the table once so that both start
from the same warm page cache. One publication. Then, one at a time, ``--repeat``
rounds of (sparkapply first unless ``--native-first``):

(a) sparkapply: ``Subscriber(config, spark=session, catalog=catalog)
    .run(until_caught_up=True)`` with a fresh slot, work dir and SQLite catalog: it
    creates the slot with an exported snapshot, copies the table in Spark tasks
    (``local[2]``, block-range slices, COPY text → Arrow → Parquet), commits one Iceberg
    snapshot, starts streaming and returns once caught up. The Spark session (and one
    warm-up job that starts the Python workers) is created once, before, and reported
    apart: a long-lived driver pays it once, not per table.
(b) native: the same table (with its primary key) on the subscriber server, then
    ``CREATE SUBSCRIPTION ... WITH (copy_data = true, create_slot = true, streaming =
    parallel)``, timed from that statement until ``pg_subscription_rel.srsubstate =
    'r'`` for the table (the table-sync worker has copied it with one COPY, caught up,
    and handed over to the apply worker). Then the subscription is dropped and the
    table emptied for the next round.

Both copies are verified: count, sum(id) and sum(d) equal the publisher's. Prints
seconds, rows/s and CPU seconds (consumer processes, publisher) of each run, the best
of each, and the ratio sparkapply / native in rows/s; with ``--out``, a JSON file
too. See bench/README.md.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from benchlib.cli import add_size_options, bench_parser, parse_bench_args
from benchlib.consumers import Consumer, NativeCopy, Results
from benchlib.report import columns, log, log_progress, machine, print_table
from benchlib.servers import scratch, server
from benchlib.sparkapply_runs import SPARK_MASTER, Sparkapply, start_spark
from benchlib.workloads import BENCH_DDL, load_bench_table

SETTINGS = {  # sparkapply.embedded's normal settings, and room for the load's WAL
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "wal_sender_timeout": "0",
}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    add_size_options(parser, rows=5_000_000, repeat=1)
    parser.add_argument("--native-first", action="store_true")
    args, output = parse_bench_args(parser, argv, None, "copy.json")
    repeat = args.repeat
    log_progress("py4j", "pyiceberg", "urllib3", "sparkapply.sink")

    with (
        scratch("sparkapply-copy-bench-") as root,
        server(root / "publisher", SETTINGS) as pub,
        server(root / "subscriber", SETTINGS) as subscriber,
    ):
        backlog = load_bench_table(pub, args.rows)
        with psycopg.connect(subscriber.dsn(), autocommit=True) as conn:
            conn.execute(BENCH_DDL)
        spark, startup, warmup = start_spark("sparkapply-copy-bench")
        log(f"Spark session and warm-up: {startup + warmup:.1f}s (not counted)")
        try:
            slots = [f"bench_sparkapply_{i}" for i in range(repeat)]
            consumers: list[Consumer] = [
                Sparkapply(spark, pub, root, slots, streamed=False),
                NativeCopy(pub, subscriber, repeat),
            ]
            results = [Results(c.name) for c in consumers]
            order = [1, 0] if args.native_first else [0, 1]
            for i in range(repeat):
                for k in order:
                    run = consumers[k].run(backlog)
                    results[k].runs.append(run)
                    log(
                        f"round {i} {consumers[k].name}: {run.seconds:.2f}s,"
                        f" {args.rows / run.seconds:,.0f} rows/s, CPU {run.cpu['consumer']:.1f}s"
                        f" consumer / {run.cpu['publisher']:.1f}s publisher"
                    )
        finally:
            spark.stop()

    print(
        f"initial copy of {args.rows:,} rows (bench: bigint pk, int, text, timestamptz, "
        f"numeric(12,2)); best of {repeat}; {os.cpu_count()} cores"
    )
    table = columns(":<34|seconds:>9.2f|rows/s:>12,.0f|CPU cons.:>11.1f|CPU pub.:>10.1f")
    rows = []
    for res in results:
        b = res.best
        rows.append((res.name, b.seconds, args.rows / b.seconds, *b.cpu.values()))
    print_table(table, rows)
    ratio = results[1].best.seconds / results[0].best.seconds
    print(f"ratio sparkapply/native (rows/s): {ratio:.2f}")
    if repeat > 1:
        runs = [(results[k].name, results[k].runs[i]) for i in range(repeat) for k in order]
        print("all runs: " + ", ".join(f"{name} {r.seconds:.2f}s" for name, r in runs))
    report: dict[str, Any] = {
        "benchmark": "copy_bench",
        "rows": args.rows,
        "repeat": repeat,
        "machine": machine(SPARK_MASTER),
        "settings": SETTINGS,
        "expected": backlog.expected.as_json() if backlog.expected else None,
        "spark_session_startup_seconds": round(startup, 3),
        "spark_warmup_job_seconds": round(warmup, 3),
        "consumers": {r.name: r.summary(args.rows) for r in results},
        "ratio_sparkapply_native": round(ratio, 3),
    }
    output.write(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
