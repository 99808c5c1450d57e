"""Soak: many small mixed batches on a prefilled table, with maintenance on and off.

    python bench/soak_bench.py                       # 2,000 batches on 1,000,000 rows
    python bench/soak_bench.py --rows 20000 --batches 30 --max-data-files 8 \
        --out /tmp/bench                             # a smoke run, not into bench/results

For each mode (``--modes on,off``): a bundled PostgreSQL 16 publisher with ``orders``
prefilled with ``--rows`` rows; sparkapply (``local[2]``) copies it; then
``--batches`` rounds, each ONE transaction inserting ``--inserts`` new rows, updating
``--updates`` random rows and deleting ``--deletes`` random rows, drained by
``Subscriber.run(until_caught_up=True)``. With maintenance on,
``Maintainer.run_due`` runs after each round (between batches, as the run loop does),
with ``[maintenance]`` defaults except the retention (``--retain`` snapshots, no age
window, so that what a soak of an hour measures is the steady state) and the options
given. With it off, only the apply's own metadata expiry (``[sink] retain_snapshots``)
runs, as before maintenance existed.

Reported per mode (and written to ``bench/results/soak.json``):

- the Iceberg commit time of each batch (``BatchStats.commit_seconds``: the commit
  and the apply's own snapshot expiry), median and mean of the
  first and the last 100 batches, and their ratio (the goal: last <= 1.5 x first);
- data files + delete files of the table, at the end and the maximum seen;
- bytes under the table's location against the bytes of the live rows (the table read
  back and written as one Parquet file): the goal is <= 1.5 (at a small ``--rows`` the
  metadata the table keeps, reported apart, dominates);
- seconds spent in maintenance; and rows equal to the publisher (count, sum of ids,
  sum of amounts), checked every 100 batches and at the end.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from benchlib.cli import bench_parser, parse_bench_args
from benchlib.report import columns, log, print_table
from benchlib.servers import SETTINGS, publish, scratch, server
from benchlib.sparkapply_runs import sparkapply_config, start_spark
from benchlib.workloads import ORDERS, ORDERS_DDL, checksum, iceberg_checksum, prefill

from sparkapply.run.batch import BatchStats

if TYPE_CHECKING:
    from sparkapply.maintain import Maintainer

IDENT = ("public", ORDERS)
INSERT = (
    "INSERT INTO orders SELECT g, g %% 100000, (g %% 1000000) / 100.0, 'new',"
    " now(), md5(g::text) FROM generate_series(%s::bigint, %s::bigint) g"
)
UPDATE = (
    "UPDATE orders SET amount = amount + 1, status = 'soaked', note = left(note, 40) || '+'"
    " WHERE id = ANY(%s)"
)
DELETE = "DELETE FROM orders WHERE id = ANY(%s)"


def _window(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "mean": statistics.fmean(values)}


def live_data_bytes(table: Any) -> int:
    """The table's live rows written as one Parquet file (the floor for its storage)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table.scan().to_arrow(), sink)
    return int(sink.getvalue().size)


def warehouse_bytes(table: Any) -> tuple[int, int, int]:
    """Bytes and files under the table's location, and the bytes of its metadata
    (metadata JSON, manifest lists, manifests: the table keeps up to
    ``write.metadata.previous-versions-max`` = 100 metadata JSON files)."""
    from sparkapply.sink.maintenance import list_files

    listed = [(path, size) for path, size, _mtime in list_files(table.location())]
    metadata = sum(size for path, size in listed if "/metadata/" in path)
    return sum(size for _, size in listed), len(listed), metadata


def soak(spark: Any, root: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from sparkapply.maintain.plan import health
    from sparkapply.run.subscriber import Subscriber

    with server(root / f"pub-{mode}", SETTINGS) as pub:
        dsn = pub.dsn()
        publish(dsn, ORDERS_DDL, ORDERS)
        prefill(dsn, args.rows)
        config = sparkapply_config(dsn, root / f"work-{mode}", f"soak_{mode}")
        sub = Subscriber(config, spark=spark)
        sub.run(until_caught_up=True)
        catalog = sub.catalog
        assert catalog is not None
        maintainer = _maintainer(args, spark, catalog) if mode == "on" else None
        rnd = random.Random(args.rows)
        next_id = args.rows + 1
        max_files = 0
        maintenance_seconds = 0.0
        batch_commits: list[float] = []
        checks = 0
        for b in range(args.batches):
            with psycopg.connect(dsn) as conn:
                conn.execute(INSERT, (next_id, next_id + args.inserts - 1))
                conn.execute(UPDATE, (rnd.sample(range(1, next_id), args.updates),))
                conn.execute(DELETE, (rnd.sample(range(1, next_id), args.deletes),))
                conn.commit()
            next_id += args.inserts
            applied: list[BatchStats] = []
            Subscriber(config, spark=spark, catalog=catalog, on_batch=applied.append).run(
                until_caught_up=True
            )
            batch_commits.append(sum(b.commit_seconds for b in applied))
            if maintainer is not None:
                t = time.perf_counter()
                maintainer.run_due([IDENT])
                maintenance_seconds += time.perf_counter() - t
            h = health(catalog.load_table(IDENT))
            max_files = max(max_files, h.files)
            if (b + 1) % 100 == 0 or b + 1 == args.batches:
                _check(dsn, catalog)
                checks += 1
                log(
                    f"{mode}: batch {b + 1}: commit {batch_commits[-1] * 1000:.0f} ms, "
                    f"{h.data_files}+{h.delete_files} files, {h.snapshots} snapshots"
                )
        table = catalog.load_table(IDENT)
        h = health(table)
        stored, stored_files, metadata_bytes = warehouse_bytes(table)
        live = live_data_bytes(table)
        window = min(100, max(1, len(batch_commits) // 2))
        first, last = _window(batch_commits[:window]), _window(batch_commits[-window:])
        return {
            "mode": mode,
            "batches": args.batches,
            "window": window,
            "commit_first_ms": {k: round(v * 1000, 1) for k, v in first.items()},
            "commit_last_ms": {k: round(v * 1000, 1) for k, v in last.items()},
            "commit_ratio_median": last["median"] / first["median"],
            "data_files": h.data_files,
            "delete_files": h.delete_files,
            "max_files": max_files,
            "snapshots": h.snapshots,
            "warehouse_bytes": stored,
            "warehouse_files": stored_files,
            "metadata_bytes": metadata_bytes,
            "live_bytes": live,
            "bytes_ratio": stored / live if live else None,
            "maintenance_seconds": round(maintenance_seconds, 2),
            "rows_equal": True,  # _check raised otherwise
            "checks": checks,
        }


def _maintainer(args: argparse.Namespace, spark: Any, catalog: Any) -> Maintainer:
    """The maintainer of mode ``on``: ``[maintenance]`` defaults but the options given
    and a retention by count alone."""
    from sparkapply.config import MaintenanceConfig
    from sparkapply.maintain import Maintainer

    return Maintainer(
        MaintenanceConfig(
            target_file_size=args.target_mib * 1024 * 1024,
            max_data_files=args.max_data_files,
            max_delete_files=args.max_delete_files,
            retain_snapshots=args.retain,
            retain_seconds=0.0,
            orphan_interval_seconds=1e9,  # nothing crashes here
        ),
        spark,
        catalog,
    )


def _check(dsn: str, catalog: Any) -> None:
    with psycopg.connect(dsn) as conn:
        expected = checksum(conn)
    got = iceberg_checksum(catalog)
    if got != expected:
        raise SystemExit(f"rows differ from the publisher: {got} != {expected}")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=2_000)
    parser.add_argument("--inserts", type=int, default=50)
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--deletes", type=int, default=10)
    parser.add_argument("--modes", default="on,off")
    parser.add_argument("--retain", type=int, default=10, help="snapshots expiry keeps")
    parser.add_argument("--target-mib", type=int, default=128)
    parser.add_argument("--max-data-files", type=int, default=64)
    parser.add_argument("--max-delete-files", type=int, default=16)
    args, output = parse_bench_args(parser, argv, "soak.json")
    spark, _, _ = start_spark("sparkapply-soak-bench")
    results = []
    try:
        with scratch("sparkapply-soak-") as root:
            for mode in args.modes.split(","):
                results.append(soak(spark, root, mode, args))
    finally:
        spark.stop()
    table = columns(
        "maintenance:>12|commit first:>14|last:>10|ratio:>7.2f|files:>7|max:>6"
        "|bytes/live:>12|maint s:>9.1f|  rows:<6"
    )
    rows = []
    for r in results:
        ratio = r["bytes_ratio"]
        rows.append(
            (
                r["mode"],
                f"{r['commit_first_ms']['median']:.1f} ms",
                f"{r['commit_last_ms']['median']:.1f} ms",
                r["commit_ratio_median"],
                r["data_files"] + r["delete_files"],
                r["max_files"],
                "-" if ratio is None else f"{ratio:.2f}",
                r["maintenance_seconds"],
                "  equal" if r["rows_equal"] else "  DIFFER",
            )
        )
    print_table(table, rows)
    args_json = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    output.write({"benchmark": "soak_bench", "args": args_json, "modes": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
