"""Initial-copy throughput: sparkapply beside PostgreSQL's own subscriber (copy_data = true).

    python bench/copy_bench.py [--rows 5000000] [--repeat 1] [--native-first]

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
of each, and the ratio sparkapply / native in rows/s. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc

from sparkapply.config import load_config
from sparkapply.embedded import EmbeddedPostgres

SETTINGS = {
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "wal_sender_timeout": "0",
}
PUBLICATION = "bench_pub"
TABLE_DDL = (
    "CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12,2))"
)
SPARK_MASTER = "local[2]"


def log(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by ``root`` and every process below it (reaped
    children included)."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parent[int(entry)] = int(fields[1])
        ticks[int(entry)] = sum(int(x) for x in fields[11:15])
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / _TICK


def postmaster_pid(server: EmbeddedPostgres) -> int:
    return int((server.data_dir / "postmaster.pid").read_text().split()[0])


@dataclass(frozen=True, slots=True)
class Checksum:
    count: int
    sum_id: int
    sum_d: Decimal


@dataclass(frozen=True, slots=True)
class Run:
    who: str
    seconds: float
    consumer_cpu: float
    publisher_cpu: float
    rows: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds


def checksum_sql(conn: psycopg.Connection[Any]) -> Checksum:
    row = conn.execute("SELECT count(*), sum(id), sum(d) FROM bench").fetchone()
    assert row is not None
    return Checksum(int(row[0]), int(row[1] or 0), Decimal(row[2] or 0))


def load(pub: EmbeddedPostgres, rows: int) -> Checksum:
    with psycopg.connect(pub.dsn(), autocommit=True) as conn:
        conn.execute(TABLE_DDL)
        t = time.perf_counter()
        step = 1_000_000
        for lo in range(1, rows + 1, step):
            hi = min(rows, lo + step - 1)
            conn.execute(
                "INSERT INTO bench SELECT g, g %% 1000, 'row ' || g || ' ' || md5(g::text), "
                "timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', "
                "(g %% 100000) / 100.0 FROM generate_series(%s::bigint, %s::bigint) g",
                (lo, hi),
            )
        log(f"loaded {rows:,} rows in {time.perf_counter() - t:.1f}s")
        t = time.perf_counter()
        conn.execute("VACUUM (FREEZE, ANALYZE) bench")
        size = conn.execute("SELECT pg_size_pretty(pg_table_size('bench'))").fetchone()
        log(f"vacuumed in {time.perf_counter() - t:.1f}s; table size {size[0] if size else '?'}")
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE bench")
        return checksum_sql(conn)  # also warms the page cache


# -- (a) sparkapply -------------------------------------------------------------------------


def _warm(i: int) -> int:
    import sparkapply.copy.tasks  # noqa: F401  (the first task's imports, done now)

    return os.getpid()


def start_spark() -> tuple[Any, float]:
    from sparkapply.apply.session import get_session

    t = time.perf_counter()
    spark = get_session(SPARK_MASTER, "sparkapply-copy-bench", {"spark.driver.memory": "2g"})
    spark.sparkContext.parallelize(range(2), 2).map(_warm).collect()
    return spark, time.perf_counter() - t


def run_sparkapply(
    spark: Any, pub: EmbeddedPostgres, root: Path, round_no: int, want: Checksum
) -> Run:
    from sparkapply.sink.catalog import open_catalog
    from sparkapply.sink.read import read_table
    from sparkapply.subscriber import Subscriber

    work = root / f"sparkapply-{round_no}"
    slot = f"bench_sparkapply_{round_no}"
    config = load_config(
        None,
        env={},
        overrides={
            "work_dir": str(work),
            "source": {"dsn": pub.dsn(), "publication": PUBLICATION, "slot": slot},
            "sink": {
                "catalog": {
                    "type": "sql",
                    "uri": f"sqlite:///{work}/catalog.db",
                    "warehouse": f"file://{work}/warehouse",
                }
            },
            "spark": {"master": SPARK_MASTER},
        },
    )
    catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    sub = Subscriber(config, spark=spark, catalog=catalog)
    cpu0 = (tree_cpu(os.getpid()), tree_cpu(postmaster_pid(pub)))
    t = time.perf_counter()
    sub.run(until_caught_up=True)
    elapsed = time.perf_counter() - t
    cpu = (tree_cpu(os.getpid()) - cpu0[0], tree_cpu(postmaster_pid(pub)) - cpu0[1])
    copier = sub._copier
    if copier is not None and copier.reports:
        r = copier.reports[0]
        log(f"sparkapply copy phase (describe, Spark job, commit): {r.seconds:.2f}s")
    table = read_table(catalog.load_table(("public", "bench")))
    got = Checksum(
        table.num_rows,
        int(pc.sum(table.column("id")).as_py() or 0),
        Decimal(pc.sum(table.column("d")).as_py() or 0),
    )
    del table
    if got != want:
        raise SystemExit(f"sparkapply copy differs: {got} != {want}")
    with psycopg.connect(pub.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    shutil.rmtree(work, ignore_errors=True)
    return Run("sparkapply", elapsed, cpu[0], cpu[1], want.count)


# -- (b) native -------------------------------------------------------------------------------


def run_native(
    pub: EmbeddedPostgres, subscriber: EmbeddedPostgres, round_no: int, want: Checksum
) -> Run:
    name = f"bench_native_{round_no}"
    with psycopg.connect(subscriber.dsn(), autocommit=True) as sub:
        sub.execute("TRUNCATE bench")
        sub.execute("CHECKPOINT")
        cpu0 = (tree_cpu(postmaster_pid(subscriber)), tree_cpu(postmaster_pid(pub)))
        t = time.perf_counter()
        sub.execute(
            f"CREATE SUBSCRIPTION {name} CONNECTION '{pub.dsn()}' PUBLICATION {PUBLICATION}"
            " WITH (copy_data = true, create_slot = true, streaming = parallel)"
        )
        polls = 0
        while True:
            row = sub.execute(
                "SELECT r.srsubstate FROM pg_subscription_rel r "
                "JOIN pg_subscription s ON s.oid = r.srsubid "
                "WHERE s.subname = %s AND r.srrelid = 'bench'::regclass",
                (name,),
            ).fetchone()
            if row is not None and row[0] == "r":
                break
            polls += 1
            if polls % 100 == 0:
                errors = sub.execute(
                    "SELECT sync_error_count FROM pg_stat_subscription_stats WHERE subname = %s",
                    (name,),
                ).fetchone()
                if errors and errors[0]:
                    raise SystemExit("the native table sync failed; see the subscriber's log")
                if time.perf_counter() - t > 3600:
                    raise SystemExit("the native table sync timed out")
            time.sleep(0.02)
        elapsed = time.perf_counter() - t
        cpu = (
            tree_cpu(postmaster_pid(subscriber)) - cpu0[0],
            tree_cpu(postmaster_pid(pub)) - cpu0[1],
        )
        got = checksum_sql(sub)
        sub.execute(f"DROP SUBSCRIPTION {name}")  # drops its slot on the publisher too
    if got != want:
        raise SystemExit(f"native copy differs: {got} != {want}")
    return Run("native", elapsed, cpu[0], cpu[1], want.count)


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--native-first", action="store_true")
    args = parser.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.INFO, format="# %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("py4j", "pyiceberg", "urllib3", "sparkapply.sink"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    root = Path(tempfile.mkdtemp(prefix="sparkapply-copy-bench-"))
    os.chmod(root, 0o755)
    pub = EmbeddedPostgres(root / "publisher", settings=SETTINGS)
    subscriber = EmbeddedPostgres(root / "subscriber", settings=SETTINGS)
    runs: list[Run] = []
    try:
        pub.start()
        subscriber.start()
        want = load(pub, args.rows)
        with psycopg.connect(subscriber.dsn(), autocommit=True) as conn:
            conn.execute(TABLE_DDL)
        spark, spark_s = start_spark()
        log(f"Spark session and warm-up: {spark_s:.1f}s (not counted)")
        order = ("native", "sparkapply") if args.native_first else ("sparkapply", "native")
        for i in range(max(1, args.repeat)):
            for who in order:
                run = (
                    run_sparkapply(spark, pub, root, i, want)
                    if who == "sparkapply"
                    else run_native(pub, subscriber, i, want)
                )
                log(
                    f"round {i} {who}: {run.seconds:.2f}s, {run.rows_per_s:,.0f} rows/s, "
                    f"CPU {run.consumer_cpu:.1f}s consumer / {run.publisher_cpu:.1f}s publisher"
                )
                runs.append(run)
        spark.stop()
    finally:
        subscriber.stop("immediate")
        pub.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)

    best = {who: min((r for r in runs if r.who == who), key=lambda r: r.seconds) for who in order}
    print(
        f"initial copy of {args.rows:,} rows (bench: bigint pk, int, text, timestamptz, "
        f"numeric(12,2)); best of {max(1, args.repeat)}; {os.cpu_count()} cores"
    )
    print(f"{'':<34}{'seconds':>9}{'rows/s':>12}{'CPU cons.':>11}{'CPU pub.':>10}")
    labels = {
        "sparkapply": f"sparkapply ({SPARK_MASTER})",
        "native": "PostgreSQL subscriber (copy_data)",
    }
    for who in ("sparkapply", "native"):
        r = best[who]
        print(
            f"{labels[who]:<34}{r.seconds:>9.2f}{r.rows_per_s:>12,.0f}"
            f"{r.consumer_cpu:>11.1f}{r.publisher_cpu:>10.1f}"
        )
    ratio = best["sparkapply"].rows_per_s / best["native"].rows_per_s
    print(f"ratio sparkapply/native (rows/s): {ratio:.2f}")
    if len(runs) > 2:
        print("all runs: " + ", ".join(f"{r.who} {r.seconds:.2f}s" for r in runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
