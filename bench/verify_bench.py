"""What ``sparkapply verify`` costs on a large table, beside a full scan by DuckDB.

    python bench/verify_bench.py [--rows 10000000] [--repeat 2] [--out PATH]
                                 [--allow-dirty]

Starts a bundled PostgreSQL 16 publisher in a temporary directory, loads ``--rows``
rows of the copy benchmark's ``bench`` table (bigint key, int, text, timestamptz,
numeric(12,2)) and publishes it. A live ``sparkapply run --config F`` (the default
config, ``local[2]``) copies it into Iceberg and stays running, as users run it. Then,
``--repeat`` times each:

- ``verify``: ``sparkapply verify --config F --json``, as a user types it, timed from
  start to exit (its own Spark session's start included), and required to match;
- the Iceberg side alone: ``verify.mirror.mirror_sums`` over the table's current
  snapshot in this process's warm ``local[2]`` session (Spark tasks read the files
  and hash every row);
- the publisher side alone: ``verify.publisher.publisher_sums``, the server hashing
  every row in SQL;
- DuckDB: full scans of the same snapshot by DuckDB's iceberg extension, every column
  of every row: with DuckDB's own (non-cryptographic) hash (``SELECT sum(hash(id, a,
  b, c, d)) FROM iceberg_scan(...)``), with the MD5 of each row's canonical text
  computed by DuckDB (verify's hash until 2026-11-25; DuckDB cannot compute the
  ``hashtextextended`` verify uses now), and fetched into Arrow.

Prints seconds (best of ``--repeat``) and rows/s; the Iceberg side against DuckDB's
scans as ratios (below 1: verify's side is faster). See bench/README.md.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import psycopg
from benchlib.cli import add_size_options, bench_parser, parse_bench_args
from benchlib.live import SlotWatch, SparkapplyProcess, cleanup, sparkapply_command
from benchlib.report import log, log_progress, machine, print_table
from benchlib.servers import scratch, server
from benchlib.sparkapply_runs import SPARK_MASTER, start_spark
from benchlib.workloads import BENCH, COPY_INSERT, load_bench_table

from sparkapply.config import load_config
from sparkapply.copy.snapshot import describe_tables
from sparkapply.verify.command import shape_of
from sparkapply.verify.mirror import mirror_sums
from sparkapply.verify.publisher import publisher_sums, total

SETTINGS = {  # sparkapply.embedded's normal settings, and room for the load's WAL
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "wal_sender_timeout": "0",
}
SLOT = "bench_verify"


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """DuckDB with the iceberg and avro extensions from their PyPI packages."""
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect()
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        root = os.path.dirname(module.__file__ or "")
        found = glob.glob(os.path.join(root, "extensions", "*", f"{name}.duckdb_extension"))
        con.execute(f"LOAD '{found[0]}'")
    return con


def best(repeat: int, step: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of ``repeat`` runs of ``step``, and the last run's result."""
    times = []
    result = None
    for _ in range(repeat):
        t = time.perf_counter()
        result = step()
        times.append(time.perf_counter() - t)
    return min(times), result


def run_cli(config_path: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKAPPLY_")}
    cmd = [*sparkapply_command(), "verify", "--config", str(config_path), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"verify exited {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    add_size_options(parser, rows=10_000_000, repeat=2)
    args, output = parse_bench_args(parser, argv, None, "verify.json")
    log_progress("py4j", "pyiceberg", "urllib3", "sparkapply")

    with scratch("sparkapply-verify-bench-") as root, server(root / "publisher", SETTINGS) as pub:
        load_bench_table(pub, args.rows)
        proc = SparkapplyProcess(root / "sparkapply", pub, SLOT)
        watch = SlotWatch(pub.dsn())
        spark = None
        try:
            t = time.perf_counter()
            proc.start()
            watch.wait_slot(SLOT, timeout=600, check=proc.check)
            # One row after the slot: confirmed only once the copy before it is done.
            with psycopg.connect(pub.dsn(), autocommit=True) as conn:
                conn.execute(COPY_INSERT, (args.rows + 1, args.rows + 1))
            watch.wait(SLOT, watch.insert_lsn(), timeout=3600, check=proc.check, what="copy")
            log(f"copied into Iceberg and caught up in {time.perf_counter() - t:.1f}s")
            spark, startup, warmup = start_spark("sparkapply-verify-bench")
            log(f"Spark session and warm-up: {startup + warmup:.1f}s (not counted)")
            figures = measure(proc.config_path, spark, args.repeat)
        finally:
            cleanup(
                proc.stop,
                watch.close,
                *([spark.stop] if spark is not None else []),
            )

    rows = args.rows + 1
    print(
        f"verify of {rows:,} rows (bench: bigint pk, int, text, timestamptz, numeric(12,2));"
        f" best of {args.repeat}; {os.cpu_count()} cores, Spark {SPARK_MASTER}"
    )
    print_table(
        [("", "<46"), ("seconds", ">9.2f"), ("rows/s", ">13,.0f")],
        [(name, s, rows / s) for name, s in figures["seconds"].items()],
    )
    print(
        "Iceberg side / DuckDB full scan:"
        f" {figures['ratio_iceberg_side_duckdb_scan']:.2f} (DuckDB's own hash),"
        f" {figures['ratio_iceberg_side_duckdb_md5_scan']:.2f} (MD5 of every row's text),"
        f" {figures['ratio_iceberg_side_duckdb_arrow_scan']:.2f} (into Arrow)"
    )
    output.write(
        {
            "benchmark": "verify_bench",
            "rows": rows,
            "repeat": args.repeat,
            "machine": machine(SPARK_MASTER),
            **figures,
        }
    )
    return 0


def measure(config_path: Path, spark: Any, repeat: int) -> dict[str, Any]:
    config = load_config(config_path)
    from sparkapply.sink.catalog import open_catalog

    catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    with psycopg.connect(config.source.dsn) as conn:
        (source,) = describe_tables(conn, config.source.publication, [("public", BENCH)])
        shape = shape_of(source)
        pg_s, pg = best(repeat, lambda: publisher_sums(conn, source, shape))
    table = catalog.load_table(config.table_identifier("public", BENCH))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    ice_s, ice = best(repeat, lambda: mirror_sums(spark, table, snapshot.snapshot_id, shape))
    if total(ice) != total(pg):
        raise SystemExit(f"the sides differ: publisher {total(pg)}, Iceberg {total(ice)}")
    location = table.metadata_location
    con = duckdb_connection()
    scan = f"FROM iceberg_scan('{location}', snapshot_from_id => {snapshot.snapshot_id})"
    hash_s, _ = best(
        repeat, lambda: con.execute(f"SELECT count(*), sum(hash(id, a, b, c, d)) {scan}").fetchall()
    )
    # Verify's canonical text of each row, hashed with MD5 (verify's hash until
    # 2026-11-25), its first 8 bytes summed: DuckDB's fastest way to that number is
    # md5 in hex, 16 digits cast. Only the row count can be checked against verify's.
    texts = "id::varchar, a::varchar, b, epoch_us(c)::varchar, d::varchar"
    first8 = f"('0x' || left(md5(concat_ws(chr(31), {texts})), 16))::ubigint::hugeint"
    md5_s, md5_row = best(
        repeat, lambda: con.execute(f"SELECT count(*), sum({first8}) {scan}").fetchone()
    )
    if int(md5_row[0]) != total(ice)[0]:
        raise SystemExit(f"DuckDB's MD5 scan {md5_row} did not read verify's rows {total(ice)}")
    arrow_s, _ = best(repeat, lambda: con.execute(f"SELECT * {scan}").to_arrow_table())
    con.close()
    cli_s, report = best(repeat, lambda: run_cli(config_path))
    if not report.get("match"):
        raise SystemExit(f"verify did not match: {report}")
    return {
        "seconds": {
            "sparkapply verify (the command, end to end)": cli_s,
            "verify's Iceberg side (Spark tasks)": ice_s,
            "verify's publisher side (SQL on the server)": pg_s,
            "DuckDB full scan: sum(hash(every column))": hash_s,
            "DuckDB full scan: MD5 of every row's canonical text": md5_s,
            "DuckDB full scan into Arrow": arrow_s,
        },
        "ratio_iceberg_side_duckdb_scan": ice_s / hash_s,
        "ratio_iceberg_side_duckdb_md5_scan": ice_s / md5_s,
        "ratio_iceberg_side_duckdb_arrow_scan": ice_s / arrow_s,
        "data_files": len(list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())),
    }


if __name__ == "__main__":
    raise SystemExit(main())
