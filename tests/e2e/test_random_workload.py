"""A seeded random workload on real PostgreSQL, mirrored round by round (merge-on-read);
after every round the Iceberg tables equal the publisher's, read through pyiceberg,
through DuckDB's iceberg extension and through iceberg-rust (DataFusion).

The workload mixes inserts, updates, deletes, key-changing updates, duplicate rows in
a REPLICA IDENTITY FULL table, updates that leave a TOASTed value unchanged, TRUNCATE
in the middle of a round, savepoints rolled back, and two-phase transactions.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import psycopg
import pytest

from sparkapply.run.batch import BatchStats
from sparkapply.sink.cuts import cuts_identifier, protected_snapshots
from tests.conftest import PgServer
from tests.mirror import Mirror, normalize
from tests.readers import READERS, Readers

pytestmark = pytest.mark.integration

SETUP = (
    "CREATE TABLE kv (id int PRIMARY KEY, name text, qty int, doc text)",
    "ALTER TABLE kv ALTER COLUMN doc SET STORAGE EXTERNAL",  # TOASTed, uncompressed
    "CREATE TABLE acct (id bigint PRIMARY KEY, bal numeric(12,2), note text, at timestamptz)",
    "CREATE TABLE dup (a int, b text)",
    "ALTER TABLE dup REPLICA IDENTITY FULL",
    "CREATE PUBLICATION pub FOR TABLE kv, acct, dup",
)


def big(i: int) -> str:
    return f"doc {i} " + "x" * 9000  # past the TOAST threshold


def keyed_op(rnd: random.Random, table: str, keys: set[int]) -> str | None:
    """One random change to a keyed table (kv's doc column is TOASTed: updates that do
    not touch it send it as unchanged)."""
    op = rnd.random()
    if op < 0.35 or not keys:
        k = rnd.randint(1, 400)
        if k in keys:
            return None
        keys.add(k)
        if table == "kv":
            return f"INSERT INTO kv VALUES ({k}, 'n{k}', {k % 10}, '{big(k)}')"
        return f"INSERT INTO acct VALUES ({k}, {k}.25, 'a{k}', now())"
    if op < 0.65:
        k = rnd.choice(sorted(keys))
        if table == "kv":
            return f"UPDATE kv SET qty = qty + {rnd.randint(1, 5)} WHERE id = {k}"
        return f"UPDATE acct SET bal = bal + 1, note = NULL WHERE id = {k}"
    if op < 0.8:
        old = rnd.choice(sorted(keys))
        new = rnd.randint(401, 900)
        if new in keys:
            return None
        keys.discard(old)
        keys.add(new)
        col = "name" if table == "kv" else "note"
        return f"UPDATE {table} SET id = {new}, {col} = 'moved' WHERE id = {old}"
    k = rnd.choice(sorted(keys))
    keys.discard(k)
    return f"DELETE FROM {table} WHERE id = {k}"


def dup_op(rnd: random.Random) -> str:
    a = rnd.randint(1, 4)
    op = rnd.random()
    if op < 0.4:
        return f"INSERT INTO dup VALUES ({a}, 'd{a}'), ({a}, 'd{a}')"
    if op < 0.7:
        return f"UPDATE dup SET b = 'u' WHERE ctid = (SELECT ctid FROM dup WHERE a = {a} LIMIT 1)"
    return f"DELETE FROM dup WHERE ctid = (SELECT ctid FROM dup WHERE a = {a} LIMIT 1)"


def round_sql(rnd: random.Random, keys: dict[str, set[int]], round_no: int) -> list[list[str]]:
    """Transactions (lists of statements) for one round."""
    txns: list[list[str]] = []
    for _ in range(rnd.randint(4, 9)):
        stmts: list[str] = []
        for _ in range(rnd.randint(1, 6)):
            pick = rnd.random()
            if pick < 0.2:
                stmts.append(dup_op(rnd))
                continue
            table = "kv" if pick < 0.5 else "acct"
            stmt = keyed_op(rnd, table, keys[table])
            if stmt is not None:
                stmts.append(stmt)
        if stmts:
            txns.append(stmts)
    if round_no == 3:
        # Key 0 is never generated, so no later insert of this round collides with it.
        txns.insert(len(txns) // 2, ["TRUNCATE kv", "INSERT INTO kv VALUES (0, 'after', 1, 'x')"])
    return txns


def execute(mirror: Mirror, rnd: random.Random, txns: list[list[str]]) -> None:
    with psycopg.connect(mirror.dsn, autocommit=True) as conn:
        for n, stmts in enumerate(txns):
            if n % 4 == 3:
                # A savepoint rolled back: its changes must not reach Iceberg.
                conn.execute("BEGIN")
                for s in stmts:
                    conn.execute(s)
                conn.execute("SAVEPOINT sp")
                conn.execute("UPDATE kv SET name = 'rolled back'")
                conn.execute("ROLLBACK TO SAVEPOINT sp")
                conn.execute("COMMIT")
            elif n % 5 == 4:
                gid = f"g{rnd.randint(0, 10**9)}"
                conn.execute("BEGIN")
                for s in stmts:
                    conn.execute(s)
                conn.execute(f"PREPARE TRANSACTION '{gid}'")
                conn.execute(f"COMMIT PREPARED '{gid}'")
            else:
                conn.execute("BEGIN")
                for s in stmts:
                    conn.execute(s)
                conn.execute("COMMIT")


def assert_readers_equal_postgres(mirror: Mirror, readers: Readers, table: str) -> None:
    """pyiceberg, DuckDB, iceberg-rust and Java Iceberg each read ``table`` as the
    publisher's rows."""
    from sparkapply.sink.read import read_table

    cols, pg = mirror.pg_rows(table)
    left = sorted((tuple(normalize(v) for v in r) for r in pg), key=repr)
    iceberg = mirror.iceberg_table(table)
    pyiceberg = read_table(iceberg)
    reads = {"pyiceberg": pyiceberg}
    for reader in READERS:
        reads[reader] = readers.read_like(reader, iceberg, pyiceberg.schema, table)
    for reader, arrow in reads.items():
        # (These tables have no list column, so every reader reads every column.)
        rows: list[tuple[Any, ...]] = [
            tuple(r[c] for c in cols) for r in arrow.select(cols).to_pylist()
        ]
        right = sorted((tuple(normalize(v) for v in r) for r in rows), key=repr)
        assert left == right, f"{table}: {reader} reads differ from PostgreSQL"


@pytest.mark.parametrize(
    ("seed", "mode"), [(11, "maintain"), (29, "split"), (47, "stage"), (53, "driver")]
)
def test_random_workload_is_mirrored_after_every_round(
    mirror: Mirror, pg_server: PgServer, seed: int, mode: str
) -> None:
    split = mode == "split"
    if split:  # every keyed table's batch folded by three key-hash partition tasks
        apply = dataclasses.replace(mirror.config.apply, split_bytes=1, max_tasks_per_table=3)
        mirror.config = dataclasses.replace(mirror.config, apply=apply)
    elif mode == "driver":  # small batches folded on the driver, not as Spark jobs
        apply = dataclasses.replace(mirror.config.apply, driver_fold_bytes=1024 * 1024)
        mirror.config = dataclasses.replace(mirror.config, apply=apply)
    elif mode == "stage":  # every change streamed, and staged in pieces of 2 kB
        pg_server.set_streaming("immediate")
        apply = dataclasses.replace(mirror.config.apply, stage_bytes=2048)
        mirror.config = dataclasses.replace(mirror.config, apply=apply)
    else:  # maintenance in the run loop, often: compaction and expiry between batches
        maintenance = dataclasses.replace(
            mirror.config.maintenance,
            max_data_files=3,
            max_delete_files=2,
            max_manifests=4,
            retain_snapshots=2,
            retain_seconds=0.0,
        )
        mirror.config = dataclasses.replace(mirror.config, maintenance=maintenance)
    try:
        tasks = _rounds(mirror, seed, mode)
    finally:
        pg_server.set_streaming("buffered")
    # Spark tasks per table and batch: none where the driver folded a small batch.
    if mode == "driver":
        assert 0 in tasks
    else:
        assert tasks and min(tasks) >= 1


def _rounds(mirror: Mirror, seed: int, mode: str) -> list[int]:
    rnd = random.Random(seed)
    mirror.sql(*SETUP)
    mirror.run()
    staged = 0
    tasks: list[int] = []

    def count(stats: BatchStats) -> None:
        tasks.extend(r.tasks for r in stats.results if r.path != "staged")

    for round_no in range(6):
        keys = {t: {int(r[0]) for r in mirror.pg_rows(f"public.{t}")[1]} for t in ("kv", "acct")}
        execute(mirror, rnd, round_sql(rnd, keys, round_no))
        staged += mirror.run(on_batch=count).staged_rows
        with Readers() as readers:
            mirror.assert_mirrored("public.kv", "public.acct", "public.dup", readers=readers)
            for table in ("public.kv", "public.acct", "public.dup"):
                assert_readers_equal_postgres(mirror, readers, table)
    # Merge-on-read: the updates and deletes left position-delete files, not rewrites.
    table = mirror.catalog.load_table(("public", "acct"))
    summaries = [s.summary for s in table.metadata.snapshots if s.summary is not None]
    if mode != "maintain":
        assert any(int(s["added-position-deletes"] or 0) > 0 for s in summaries)
        if mode == "stage":  # some insert-only transactions were staged and used
            assert staged > 0
    else:  # compaction ran in the loop and folded the deletes back
        assert any(s.operation.value == "replace" for s in summaries)
        # Expiry ran in the loop too: what it left is the newest few, and the snapshots
        # kept cuts name (every cut of the last minute stays readable).
        kept = protected_snapshots(mirror.catalog, cuts_identifier("sparkapply.cuts"), 0.0)
        named = kept(("public", "acct"))
        left = [s for s in table.metadata.snapshots if s.snapshot_id not in named]
        assert named and len(left) <= 4, (len(named), len(left))
    return tasks
