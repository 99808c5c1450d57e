"""Write amplification of scattered updates: bytes written per batch against table size.

    python bench/writeamp_bench.py [--sizes 100000,1000000] [--batches 10] [--rows-per-batch 100]
                                   [--out PATH] [--allow-dirty]

For each table size: a bundled PostgreSQL 16 publisher with ``orders`` prefilled with
that many rows; sparkapply (``local[2]``) copies it (its initial copy); then
``--batches`` rounds, each ONE transaction updating ``--rows-per-batch`` random rows,
each drained by ``Subscriber.run(until_caught_up=True)``. Per batch it reports the
bytes the batch's snapshot added (data files + position-delete files, from the
snapshot summary) as a share of the table's live data bytes, the bytes it removed
(a copy-on-write apply would remove as much as it adds), and the seconds
``Applier.apply`` took (``BatchStats.started`` to ``finished``). Every round is
verified against the publisher (count, sums).
The table sizes side by side show how apply time grows with the table.

Results go to ``bench/results/writeamp.json``.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
from benchlib.cli import bench_parser, parse_bench_args
from benchlib.report import log, print_table
from benchlib.servers import SETTINGS, publish, scratch, server
from benchlib.sparkapply_runs import sparkapply_config, start_spark
from benchlib.workloads import ORDERS, ORDERS_DDL, checksum, iceberg_checksum, prefill

from sparkapply.run.batch import BatchStats


def measure_size(spark: Any, root: Path, rows: int, batches: int, per_batch: int) -> dict[str, Any]:
    from sparkapply.run.subscriber import Subscriber

    with server(root / f"pub-{rows}", SETTINGS) as pub:
        dsn = pub.dsn()
        publish(dsn, ORDERS_DDL, ORDERS)
        prefill(dsn, rows)
        config = sparkapply_config(dsn, root / f"work-{rows}", "writeamp")
        started = time.monotonic()
        sub = Subscriber(config, spark=spark)
        sub.run(until_caught_up=True)
        copy_seconds = time.monotonic() - started
        catalog = sub.catalog
        assert catalog is not None
        rnd = random.Random(rows)
        rounds = []
        for _ in range(batches):
            ids = rnd.sample(range(1, rows + 1), per_batch)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "UPDATE orders SET amount = amount + 1, status = 'bumped' WHERE id = ANY(%s)",
                    (ids,),
                )
                expected = checksum(conn)
            applied: list[BatchStats] = []
            run = Subscriber(config, spark=spark, catalog=catalog, on_batch=applied.append)
            started = time.monotonic()
            run.run(until_caught_up=True)
            wall = time.monotonic() - started
            got = iceberg_checksum(catalog)
            if got != expected:
                raise SystemExit(f"rows differ from the publisher: {got} != {expected}")
            snapshot = catalog.load_table(("public", ORDERS)).current_snapshot()
            assert snapshot is not None and snapshot.summary is not None
            summary = snapshot.summary
            total = int(summary["total-files-size"] or 0)
            added = int(summary.get("added-files-size") or 0)
            removed = int(summary.get("removed-files-size") or 0)
            rounds.append(
                {
                    "added_bytes": added,
                    "removed_bytes": removed,
                    "table_bytes": total,
                    "added_share": added / total,
                    "apply_seconds": sum(b.finished - b.started for b in applied),
                    "run_seconds": wall,
                    "delete_files": int(summary["total-delete-files"] or 0),
                }
            )
            log(
                f"{rows:>10,} rows: +{added:>9,} B -{removed:>9,} B of {total:>11,} B"
                f" ({added / total:.3%}); apply {rounds[-1]['apply_seconds']:.2f}s"
            )
        return {
            "rows": rows,
            "initial_copy_seconds": round(copy_seconds, 2),
            "added_share_max": max(r["added_share"] for r in rounds),
            "added_share_median": statistics.median(r["added_share"] for r in rounds),
            "removed_bytes_max": max(r["removed_bytes"] for r in rounds),
            "apply_seconds_median": statistics.median(r["apply_seconds"] for r in rounds),
            "rounds": rounds,
        }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rows-per-batch", type=int, default=100)
    args, output = parse_bench_args(parser, argv, "writeamp.json")
    sizes = [int(s) for s in args.sizes.split(",")]
    spark, _, _ = start_spark("sparkapply-writeamp-bench")
    results = []
    try:
        with scratch("sparkapply-writeamp-") as root:
            for rows in sizes:
                results.append(measure_size(spark, root, rows, args.batches, args.rows_per_batch))
    finally:
        spark.stop()
    columns = [
        ("table rows", ">12,"),
        ("max bytes/batch", ">17.3%"),
        ("median", ">9.3%"),
        ("apply s (median)", ">18.2f"),
    ]
    keys = ("rows", "added_share_max", "added_share_median", "apply_seconds_median")
    print_table(columns, [[r[k] for k in keys] for r in results])
    report = {
        "benchmark": "writeamp_bench",
        "batches": args.batches,
        "rows_per_batch": args.rows_per_batch,
        "sizes": results,
    }
    output.write(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
