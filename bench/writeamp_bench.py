"""Write amplification of scattered updates: bytes written per batch against table size.

    python bench/writeamp_bench.py [--sizes 100000,1000000] [--batches 10] [--rows-per-batch 100]

For each table size: a bundled PostgreSQL 16 publisher with ``orders`` prefilled with
that many rows; sparkapply (``local[2]``) copies it (its initial copy); then
``--batches`` rounds, each ONE transaction updating ``--rows-per-batch`` random rows,
each drained by ``Subscriber.run(until_caught_up=True)``. Per batch it reports the
bytes the batch's snapshot added (data files + position-delete files, from the
snapshot summary) as a share of the table's live data bytes, the bytes it removed
(a copy-on-write apply would remove as much as it adds), and the seconds
``Applier.apply`` took. Every round is verified against the publisher (count, sums).
The table sizes side by side show how apply time grows with the table.

Results go to ``bench/results/writeamp.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

_BENCH = str(Path(__file__).resolve().parent)
sys.path.insert(0, _BENCH)
# Spark's Python workers import apply_bench's functions by name: give them the folder.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_BENCH, os.environ.get("PYTHONPATH", "")) if p
)

from apply_bench import (  # noqa: E402
    DDL,
    PUBLICATION,
    SETTINGS,
    TABLE,
    checksum,
    code_version,
    iceberg_checksum,
    prefill,
    sparkapply_config,
    start_spark,
)

from sparkapply.embedded import EmbeddedPostgres  # noqa: E402


def measure_size(spark: Any, root: Path, rows: int, batches: int, per_batch: int) -> dict[str, Any]:
    import sparkapply.apply.batch as batch_mod
    from sparkapply.subscriber import Subscriber

    pub = EmbeddedPostgres(root / f"pub-{rows}", settings=SETTINGS)
    pub.start()
    apply_seconds: list[float] = []
    real_apply = batch_mod.Applier.apply

    def timed_apply(self: Any, batch: Any) -> Any:
        t = time.perf_counter()
        try:
            return real_apply(self, batch)
        finally:
            apply_seconds.append(time.perf_counter() - t)

    try:
        dsn = pub.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL)
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
        prefill(dsn, rows)
        config = sparkapply_config(dsn, root / f"work-{rows}", "writeamp")
        t = time.perf_counter()
        sub = Subscriber(config, spark=spark)
        sub.run(until_caught_up=True)
        copy_seconds = time.perf_counter() - t
        catalog = sub.catalog
        assert catalog is not None
        rnd = random.Random(rows)
        rounds = []
        batch_mod.Applier.apply = timed_apply  # type: ignore[method-assign]
        try:
            for _ in range(batches):
                ids = rnd.sample(range(1, rows + 1), per_batch)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(
                        "UPDATE orders SET amount = amount + 1, status = 'bumped'"
                        " WHERE id = ANY(%s)",
                        (ids,),
                    )
                    expected = checksum(conn)
                before = len(apply_seconds)
                t = time.perf_counter()
                Subscriber(config, spark=spark, catalog=catalog).run(until_caught_up=True)
                wall = time.perf_counter() - t
                table = catalog.load_table(("public", TABLE))
                got = iceberg_checksum(catalog)
                if (got.count, got.sum_id, got.sum_amount) != (
                    expected.count,
                    expected.sum_id,
                    expected.sum_amount,
                ):
                    raise SystemExit(f"rows differ from the publisher: {got} != {expected}")
                snapshot = table.current_snapshot()
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
                        "apply_seconds": sum(apply_seconds[before:]),
                        "run_seconds": wall,
                        "delete_files": int(summary["total-delete-files"] or 0),
                    }
                )
                print(
                    f"{rows:>10,} rows: +{added:>9,} B -{removed:>9,} B of {total:>11,} B"
                    f" ({added / total:.3%}); apply {rounds[-1]['apply_seconds']:.2f}s",
                    flush=True,
                )
        finally:
            batch_mod.Applier.apply = real_apply  # type: ignore[method-assign]
        return {
            "rows": rows,
            "initial_copy_seconds": round(copy_seconds, 2),
            "added_share_max": max(r["added_share"] for r in rounds),
            "added_share_median": statistics.median(r["added_share"] for r in rounds),
            "removed_bytes_max": max(r["removed_bytes"] for r in rounds),
            "apply_seconds_median": statistics.median(r["apply_seconds"] for r in rounds),
            "rounds": rounds,
        }
    finally:
        pub.stop("immediate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rows-per-batch", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    out = args.out or Path(__file__).resolve().parent / "results" / "writeamp.json"
    spark, _, _ = start_spark()
    root = Path(tempfile.mkdtemp(prefix="sparkapply-writeamp-"))
    os.chmod(root, 0o755)
    results = []
    try:
        for rows in sizes:
            results.append(measure_size(spark, root, rows, args.batches, args.rows_per_batch))
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'table rows':>12}{'max bytes/batch':>17}{'median':>9}{'apply s (median)':>18}")
    for r in results:
        print(
            f"{r['rows']:>12,}{r['added_share_max']:>16.3%}{r['added_share_median']:>9.3%}"
            f"{r['apply_seconds_median']:>18.2f}"
        )
    report = {
        "benchmark": "writeamp_bench",
        "batches": args.batches,
        "rows_per_batch": args.rows_per_batch,
        "code": code_version(),
        "sizes": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
