"""Truncate-and-reload in one transaction against the same load without the TRUNCATE.

    python bench/reload_bench.py [--rows 1000000] [--repeat 2] [--work-mem 64kB]
                                 [--no-probe] [--out PATH] [--allow-dirty]

After a TRUNCATE, PostgreSQL sends the table's RELATION again in every stream chunk of
the transaction, and a small ``logical_decoding_work_mem`` makes many chunks: at 64kB a
1,000,000-row load is thousands of them. Receiving such a transaction once went
quadratic in its chunks; this benchmark shows whether it still does.

One bundled PostgreSQL 16 publisher with the apply benchmark's settings
(``benchlib.servers.SETTINGS``) except ``logical_decoding_work_mem = --work-mem``, and
the ``orders`` table. Two loads, alternated over ``--repeat`` rounds (one at a time:
the machine has 2 cores), each through sparkapply as a user runs it:

``load``    the table is emptied, a sparkapply slot primed on it (a first
            ``run(until_caught_up=True)``: slot, Iceberg table), then ``--rows`` rows are
            inserted in ONE transaction;
``reload``  the table holds the same ``--rows`` rows, a sparkapply slot is primed (its
            initial copy takes them), then ONE transaction truncates the table and
            inserts the same rows again.

Each backlog is then drained by ``Subscriber(config, spark=session).run(until_caught_up=
True)`` (``benchlib.sparkapply_runs.Sparkapply``: default ``[apply]`` settings, its own
work dir and SQLite catalog, ``local[2]``), timed from the call to its return, and
verified: count, sum(id) and sum(amount) of the Iceberg table equal the publisher's, and
every row came through the stream. The ratio is the best reload over the best load: a
receive path linear in the chunks keeps it near what the two applies differ by (the
load's rows are staged while they arrive, the reload's are applied at the commit after
the TRUNCATE).

Unless ``--no-probe``, in the first round a slot created before each backlog is read
through the SQL interface, untimed, to count what the stream holds (stream chunks,
RELATION, TRUNCATE and INSERT messages). Results go to
``bench/results/reload_<rows>.json``. See bench/README.md.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from benchlib.cli import add_size_options, bench_parser, parse_bench_args
from benchlib.consumers import PLUGIN_OPTIONS, Results, Run
from benchlib.report import log, machine, print_table
from benchlib.servers import SETTINGS, create_slot, insert_lsn, publish, scratch, server
from benchlib.sparkapply_runs import SPARK_MASTER, Sparkapply, start_spark
from benchlib.workloads import (
    ORDERS,
    ORDERS_DDL,
    ORDERS_INSERT,
    Backlog,
    end_backlog,
    prefill,
    write_backlog,
)

from sparkapply.embedded import EmbeddedPostgres

LOADS = ("load", "reload")
PROBE_SLOT = "reload_probe"
TAGS = {"S": "stream_chunks", "R": "relation", "T": "truncate", "I": "insert"}


def write_reload(dsn: str, rows: int) -> Backlog:
    """BEGIN; TRUNCATE orders; the ``bulk`` rows; COMMIT; ended as ``write_backlog``'s."""
    b = Backlog("reload", rows, transactions=1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        b.start_lsn = insert_lsn(conn)
        t = time.perf_counter()
        with conn.transaction():
            conn.execute(f"TRUNCATE {ORDERS}")
            b.inserts = conn.execute(ORDERS_INSERT, (1, rows)).rowcount
        b.seconds = time.perf_counter() - t
        end_backlog(conn, b, "reload_bench")
    return b


def probe(dsn: str) -> dict[str, int]:
    """Count what PROBE_SLOT's stream holds, by message kind; drops the slot."""
    options = [x for kv in PLUGIN_OPTIONS.items() for x in kv]
    counts = ", ".join(f"count(*) FILTER (WHERE get_byte(data, 0) = {ord(tag)})" for tag in TAGS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*), {counts} FROM pg_logical_slot_get_binary_changes("
            "%s, NULL, NULL, VARIADIC %s::text[])",
            (PROBE_SLOT, options),
        ).fetchone()
        conn.execute("SELECT pg_drop_replication_slot(%s)", (PROBE_SLOT,))
    assert row is not None
    return {
        "messages": int(row[0]),
        **{name: int(n) for name, n in zip(TAGS.values(), row[1:], strict=True)},
    }


def one_round(
    spark: Any, pub: EmbeddedPostgres, tmp: Any, load: str, i: int, rows: int, probing: bool
) -> tuple[Backlog, Run, dict[str, int] | None]:
    dsn = pub.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        if load == "load":
            conn.execute(f"TRUNCATE {ORDERS}")
            conn.execute("CHECKPOINT")
        else:
            row = conn.execute(f"SELECT count(*) FROM {ORDERS}").fetchone()
            if row is None or row[0] != rows:
                prefill(dsn, rows)
    consumer = Sparkapply(spark, pub, tmp, [f"{load}_{i}"], streamed=True)
    consumer.prepare()  # the reload's initial copy takes the rows it then replaces
    if probing:
        create_slot(dsn, PROBE_SLOT)
    backlog = write_backlog(dsn, "bulk", rows) if load == "load" else write_reload(dsn, rows)
    log(f"round {i + 1}: {load} backlog {backlog.wal_bytes / 1e6:.1f} MB of WAL")
    run = consumer.run(backlog)
    receive = run.phases.get("receive", 0.0)
    log(
        f"round {i + 1}: {load} {run.seconds:.2f}s (load {run.load_before:.2f});"
        f" receive {receive:.2f}s, spark job {run.phases.get('spark_job', 0.0):.2f}s"
    )
    stream = probe(dsn) if probing else None
    if stream is not None:
        log(f"{load} stream: {stream}")
    return backlog, run, stream


def print_report(rows: int, work_mem: str, results: dict[str, Results]) -> float:
    print(
        f"{rows:,} rows in one transaction, logical_decoding_work_mem={work_mem};"
        f" best of {len(results['load'].runs)}, one load at a time"
    )
    columns = [
        ("load", "<8"),
        ("seconds", ">8.2f"),
        ("receive", ">8.2f"),
        ("spark job", ">10.2f"),
        ("recv us/row", ">12.2f"),
        ("staged rows", ">12,"),
        ("   all runs (s)", "<20"),
    ]
    table = []
    for load, res in results.items():
        b = res.best
        cpu = b.detail.get("receive_thread_cpu_seconds") or 0.0
        table.append(
            (
                load,
                b.seconds,
                b.phases.get("receive", 0.0),
                b.phases.get("spark_job", 0.0),
                cpu / rows * 1e6,
                b.detail["staged_rows"],
                "   " + " ".join(f"{r.seconds:.2f}" for r in res.runs),
            )
        )
    print_table(columns, table)
    ratio = results["reload"].best.seconds / results["load"].best.seconds
    print(f"ratio reload/load: {ratio:.2f} (goal: at most 1.5)")
    print("recv us/row: the receiving thread's CPU during receive, per row")
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    add_size_options(parser, rows=1_000_000, repeat=2)
    parser.add_argument("--work-mem", default="64kB", help="logical_decoding_work_mem")
    parser.add_argument("--no-probe", action="store_true", help="do not count the stream")
    args, output = parse_bench_args(parser, argv, "reload_<rows>.json")
    repeat = args.repeat
    logging.basicConfig(level=logging.WARNING)
    settings = {**SETTINGS, "logical_decoding_work_mem": args.work_mem}

    spark, spark_startup, spark_warmup = start_spark("sparkapply-reload-bench")
    log(f"Spark session {spark_startup:.1f}s, warm-up job {spark_warmup:.1f}s")
    results = {load: Results(load) for load in LOADS}
    backlogs: dict[str, dict[str, Any]] = {}
    streams: dict[str, dict[str, int]] = {}
    try:
        with scratch("sparkapply-reload-bench-") as tmp, server(tmp / "pub", settings) as pub:
            publish(pub.dsn(), ORDERS_DDL, ORDERS)
            for i in range(repeat):
                for load in LOADS:
                    probing = i == 0 and not args.no_probe
                    backlog, run, stream = one_round(spark, pub, tmp, load, i, args.rows, probing)
                    results[load].runs.append(run)
                    backlogs.setdefault(load, backlog.as_json())
                    if stream is not None:
                        streams[load] = stream
    finally:
        spark.stop()

    ratio = print_report(args.rows, args.work_mem, results)
    output.write(
        {
            "benchmark": "reload_bench",
            "rows": args.rows,
            "repeat": repeat,
            "machine": machine(SPARK_MASTER),
            "settings": settings,
            "spark_session_startup_seconds": round(spark_startup, 3),
            "spark_warmup_job_seconds": round(spark_warmup, 3),
            "backlogs": backlogs,
            "streams": streams,
            "loads": {load: res.summary(args.rows) for load, res in results.items()},
            "ratio_reload_to_load": round(ratio, 3),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
