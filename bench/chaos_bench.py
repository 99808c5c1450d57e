"""Chaos: a random concurrent workload on a live `sparkapply run` killed (-9) and
restarted at random; then catch up and prove the mirror right with `sparkapply verify`.

    python bench/chaos_bench.py                          # 10 minutes, PostgreSQL 16
    python bench/chaos_bench.py --minutes 2 --pg 17 --seed 3 --out /tmp/chaos

Not a speed benchmark: it checks, from outside and as a user runs it, that the tables
are exactly right after any crash. A bundled PostgreSQL (``--pg``) publishes seven
tables of the shapes users have: a bigint key with a TOASTed text, jsonb and numeric;
a uuid key; a composite text key; no key with REPLICA IDENTITY FULL (duplicates); no
key and no identity (insert-only, its own publication); a unique index as identity;
a partitioned table published through its root. ``--workers`` sessions run random
transactions against them: small ones, large ones (streamed: the server runs with
``logical_decoding_work_mem = 64kB``), key moves, rows moving between partitions,
savepoints rolled back, rollbacks, PREPARE TRANSACTION then COMMIT or ROLLBACK
PREPARED, TRUNCATE, and ``ADD COLUMN`` with and without a default.

The consumer is the CLI, ``sparkapply run --config F``, with small staging pieces and
an aggressive maintenance (compaction at 4 data files, an orphan sweep every 10 s
with a 30 s grace), killed with SIGKILL every ``--kill-min``..``--kill-max`` seconds
and started again. At the end the workload stops, prepared transactions are
committed, ``run --until-caught-up`` drains the backlog, and ``verify`` (with a
``run`` live, as a user would) compares every table with the publisher at one LSN.
The summary (transactions, kills, runs that exited by themselves, the verify table)
goes to ``OUT/chaos.json``; the exit status is verify's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from sparkapply.embedded import EmbeddedPostgres, installed_bin_dir

SETUP = """
CREATE TABLE t_int (id bigint PRIMARY KEY, v int, s text, doc text, j jsonb,
                    n numeric(12,2), ts timestamptz);
ALTER TABLE t_int ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE TABLE t_uuid (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), v int, s text);
CREATE TABLE t_comp (a text, b int, v int, PRIMARY KEY (a, b));
CREATE TABLE t_full (a int, b text);
ALTER TABLE t_full REPLICA IDENTITY FULL;
CREATE TABLE t_log (a int, b text);
CREATE TABLE t_idx (id int NOT NULL, code text NOT NULL, v int);
CREATE UNIQUE INDEX t_idx_code ON t_idx (code);
ALTER TABLE t_idx REPLICA IDENTITY USING INDEX t_idx_code;
CREATE TABLE t_part (id bigint, k int, v int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);
CREATE TABLE t_part_lo PARTITION OF t_part FOR VALUES FROM (0) TO (50);
CREATE TABLE t_part_hi PARTITION OF t_part FOR VALUES FROM (50) TO (100);
CREATE PUBLICATION pub FOR TABLE t_int, t_uuid, t_comp, t_full, t_idx, t_part
    WITH (publish_via_partition_root = true);
CREATE PUBLICATION pub_ins FOR TABLE t_log WITH (publish = 'insert');
INSERT INTO t_int SELECT g, g, 's' || g, NULL, jsonb_build_object('g', g), g * 1.5, now()
    FROM generate_series(1, 2000) g;
INSERT INTO t_uuid (v, s) SELECT g, 'u' || g FROM generate_series(1, 500) g;
INSERT INTO t_comp SELECT 'k' || (g % 50), g, g FROM generate_series(1, 1000) g;
INSERT INTO t_full SELECT g % 100, 'f' || (g % 7) FROM generate_series(1, 500) g;
INSERT INTO t_idx SELECT g, 'c' || g, g FROM generate_series(1, 500) g;
INSERT INTO t_part SELECT g, g % 100, g FROM generate_series(1, 1000) g;
"""
TABLES = ("t_int", "t_uuid", "t_comp", "t_full", "t_log", "t_idx", "t_part")
ONE = "(SELECT {k} FROM {t} ORDER BY random() LIMIT 1)"


class Workload:
    """Random transactions; every new key comes from one counter (no collisions)."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.dsn = dsn
        self.seed = seed
        self.ids = itertools.count(10_000_000)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = {"committed": 0, "prepared": 0, "failed": 0}

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def small(self, rnd: random.Random, cur: psycopg.Cursor[Any]) -> None:
        for _ in range(rnd.randint(1, 6)):
            cur.execute(self._statement(rnd), None)

    def _statement(self, rnd: random.Random) -> Any:
        i = next(self.ids)
        doc = f"'{'d' * 3000}{i}'" if rnd.random() < 0.3 else "NULL"
        choices = [
            f"INSERT INTO t_int VALUES ({i}, {rnd.randint(0, 99)}, 's{i}', {doc},"
            f" '{{\"i\": {i}}}', {i % 1000}.25, now())",
            f"UPDATE t_int SET v = v + 1, ts = now() WHERE id = {ONE.format(k='id', t='t_int')}",
            f"UPDATE t_int SET id = {i} WHERE id = {ONE.format(k='id', t='t_int')}",
            f"DELETE FROM t_int WHERE id = {ONE.format(k='id', t='t_int')}",
            f"INSERT INTO t_uuid (v, s) VALUES ({rnd.randint(0, 9)}, 'x')",
            f"UPDATE t_uuid SET id = gen_random_uuid() WHERE id = {ONE.format(k='id', t='t_uuid')}",
            f"INSERT INTO t_comp VALUES ('k{rnd.randint(0, 60)}', {i}, 0) ON CONFLICT DO NOTHING",
            "UPDATE t_comp SET v = v + 1, a = a || 'm' WHERE (a, b) = "
            + ONE.format(k="a, b", t="t_comp"),
            f"INSERT INTO t_full VALUES ({rnd.randint(0, 100)}, 'f{rnd.randint(0, 6)}')",
            "UPDATE t_full SET b = b || '+' WHERE ctid = "
            f"(SELECT ctid FROM t_full WHERE a = {rnd.randint(0, 100)} LIMIT 1)",
            "DELETE FROM t_full WHERE ctid = "
            f"(SELECT ctid FROM t_full WHERE a = {rnd.randint(0, 100)} LIMIT 1)",
            f"INSERT INTO t_log VALUES ({rnd.randint(0, 1000)}, 'log')",
            f"INSERT INTO t_idx VALUES ({i}, 'c{i}', 0)",
            "UPDATE t_idx SET code = code || 'z', v = v + 1 WHERE id = "
            + ONE.format(k="id", t="t_idx"),
            "UPDATE t_part SET k = (k + 37) % 100, v = v + 1 WHERE (id, k) = "
            + ONE.format(k="id, k", t="t_part"),
            f"INSERT INTO t_part VALUES ({i}, {rnd.randint(0, 99)}, 0)",
        ]
        return rnd.choice(choices)

    def large(self, rnd: random.Random, cur: psycopg.Cursor[Any]) -> None:
        base = next(self.ids)
        for _ in range(3000):
            next(self.ids)
        cur.execute(
            rnd.choice(
                [
                    "INSERT INTO t_int SELECT g, g % 100, 'b' || g, CASE WHEN g % 10 = 0 THEN "
                    f"repeat('t', 4000) END, '{{}}', 1, now() FROM generate_series({base}, "
                    f"{base + rnd.randint(500, 3000)}) g",
                    f"UPDATE t_int SET v = v + 1 WHERE id % 7 = {rnd.randint(0, 6)}",
                    f"UPDATE t_part SET v = v + 1 WHERE k % 5 = {rnd.randint(0, 4)}",
                    "DELETE FROM t_int WHERE id IN "
                    "(SELECT id FROM t_int ORDER BY random() LIMIT 300)",
                ]
            ),
            None,
        )

    def rare(self, rnd: random.Random, conn: psycopg.Connection[Any]) -> None:
        if rnd.random() < 0.5:
            conn.execute("TRUNCATE t_comp")
            conn.execute(
                "INSERT INTO t_comp SELECT 'k' || (g % 50), g, g FROM generate_series(1, 200) g"
            )
        else:
            column = f"c{next(self.ids)}"
            default = " DEFAULT 3" if rnd.random() < 0.5 else ""
            conn.execute(f"ALTER TABLE t_uuid ADD COLUMN {column} int{default}", None)
            conn.execute(f"UPDATE t_uuid SET {column} = v WHERE v < 3", None)

    def worker(self, n: int) -> None:
        rnd = random.Random(self.seed * 100 + n)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                try:
                    self._one(rnd, n, conn)
                except psycopg.Error:  # deadlocks, rows moved by another session
                    self.count("failed")
                    if not conn.autocommit:
                        conn.rollback()
                        conn.autocommit = True
                time.sleep(rnd.random() * 0.05)

    def _one(self, rnd: random.Random, n: int, conn: psycopg.Connection[Any]) -> None:
        kind = rnd.random()
        if kind < 0.03 and n == 0:
            self.rare(rnd, conn)
        elif kind < 0.2:
            self._two_phase(rnd, n, conn)
        else:
            with conn.transaction() as tx:
                cur = conn.cursor()
                if kind < 0.3:
                    self.large(rnd, cur)
                else:
                    self.small(rnd, cur)
                if kind > 0.85:  # a savepoint, rolled back half the time
                    with conn.transaction(force_rollback=rnd.random() < 0.5):
                        self.small(rnd, cur)
                    self.small(rnd, cur)
                if 0.8 < kind <= 0.85:
                    raise psycopg.Rollback(tx)
        self.count("committed")

    def _two_phase(self, rnd: random.Random, n: int, conn: psycopg.Connection[Any]) -> None:
        gid = f"chaos-{n}-{next(self.ids)}"
        conn.autocommit = False
        cur = conn.cursor()
        self.small(rnd, cur)
        if rnd.random() < 0.3:
            self.large(rnd, cur)
        cur.execute(f"PREPARE TRANSACTION '{gid}'", None)
        conn.autocommit = True
        self.count("prepared")
        time.sleep(rnd.random() * 2)
        ending = "COMMIT" if rnd.random() < 0.7 else "ROLLBACK"
        conn.execute(f"{ending} PREPARED '{gid}'", None)


def write_config(root: Path, dsn: str) -> Path:
    cfg = root / "chaos.toml"
    cfg.write_text(
        f'work_dir = "{root}/work"\n'
        f'[source]\ndsn = "{dsn}"\npublication = ["pub", "pub_ins"]\nslot = "chaos"\n'
        "reconnect_max_backoff = 2.0\n"
        '[sink.catalog]\ntype = "sql"\nuri = "sqlite:///{work_dir}/catalog.db"\n'
        '[spark]\nmaster = "local[2]"\n'
        "[apply]\nstage_bytes = 65536\nsplit_bytes = 65536\n"
        "[maintenance]\nmax_data_files = 4\nmax_delete_files = 2\n"
        "orphan_grace_seconds = 30\norphan_interval_seconds = 10\n"
    )
    return cfg


def sparkapply(cfg: Path, *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    command = [sys.executable, "-m", "sparkapply", *args, "--config", str(cfg)]
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pg", type=int, default=16, help="PostgreSQL major version")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-min", type=float, default=8.0)
    parser.add_argument("--kill-max", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sparkapply-chaos-"))
    bin_dir = None if args.pg == 16 else installed_bin_dir(args.pg)
    settings = {"logical_decoding_work_mem": "64kB", "max_prepared_transactions": "20"}
    pg = EmbeddedPostgres(root / "pg", settings=settings, bin_dir=bin_dir)
    pg.init()
    pg.start()
    try:
        return chaos(args, root, pg.dsn())
    finally:
        pg.stop()


def chaos(args: argparse.Namespace, root: Path, dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SETUP, None)
    cfg = write_config(root, dsn)
    load = Workload(dsn, args.seed)
    workers = [threading.Thread(target=load.worker, args=(n,)) for n in range(args.workers)]
    for w in workers:
        w.start()
    rnd = random.Random(args.seed)
    runs, kills, exited = 0, 0, []
    run = sparkapply(cfg, "run", log=root / "run0.log")
    deadline = time.monotonic() + args.minutes * 60
    while time.monotonic() < deadline:
        time.sleep(rnd.uniform(args.kill_min, args.kill_max))
        if run.poll() is not None:
            exited.append({"run": runs, "exit": run.returncode})
        else:
            run.send_signal(signal.SIGKILL)
            run.wait()
            kills += 1
        time.sleep(rnd.uniform(0, 2))
        runs += 1
        run = sparkapply(cfg, "run", log=root / f"run{runs}.log")
    load.stop.set()
    for w in workers:
        w.join()
    run.send_signal(signal.SIGTERM)
    run.wait()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall():
            conn.execute(f"COMMIT PREPARED '{gid}'", None)
    started = time.monotonic()
    catch_up = sparkapply(cfg, "run", "--until-caught-up", log=root / "catch-up.log").wait()
    drained = time.monotonic() - started
    live = sparkapply(cfg, "run", log=root / "live.log")
    verify = subprocess.run(
        [sys.executable, "-m", "sparkapply", "verify", "--config", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
    )
    live.send_signal(signal.SIGTERM)
    live.wait()
    report = {
        "minutes": args.minutes,
        "seed": args.seed,
        "postgres": args.pg,
        "transactions": load.counts,
        "kills": kills,
        "runs_that_exited": exited,
        "catch_up_exit": catch_up,
        "catch_up_seconds": round(drained, 1),
        "verify_exit": verify.returncode,
        "verify": verify.stdout.strip().splitlines(),
        "logs": str(root),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if verify.returncode == 0 and catch_up == 0 and not exited else 1


if __name__ == "__main__":
    sys.exit(main())
