"""The tables, the rows and the backlogs the benchmarks replicate, and their checksums.

``orders`` is the apply benchmarks' table (apply, writeamp, soak); ``bench`` the
decode and copy benchmarks'. A backlog is written once, with every consumer stopped,
and each consumer's copy is checked against the publisher's checksum afterwards.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg

from benchlib.report import log
from benchlib.servers import PUBLICATION, insert_lsn
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.lsn import INVALID_LSN, Lsn

ORDERS = "orders"
ORDERS_DDL = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer int, amount numeric(12, 2),"
    " status text, created_at timestamptz, note text)"
)
ORDERS_INSERT = (
    "INSERT INTO orders SELECT g, (g * 7919) %% 100000, ((g * 37) %% 1000000) / 100.0,"
    " (ARRAY['new', 'paid', 'shipped', 'cancelled'])[1 + g %% 4],"
    " timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', md5(g::text)"
    " FROM generate_series(%s::bigint, %s::bigint) g"
)
MIXED_UPDATE = (
    "UPDATE orders SET amount = amount + 1, status = 'refunded', note = note || ' (refund)'"
    " WHERE id BETWEEN %s AND %s AND id %% 10 = 0"
)
MIXED_DELETE = "DELETE FROM orders WHERE id BETWEEN %s AND %s AND id %% 20 = 5"
TXN_ROWS = 1_000  # mixed: inserts per transaction
BLOCK_ROWS = 10_000  # mixed: one update and one delete transaction per block
WORKLOADS = ("bulk", "mixed", "update", "scatter")
PREFILLED = ("update", "scatter")  # workloads on a table filled before any consumer
SCATTER_SEED = 20_251_123

BENCH = "bench"
BENCH_DDL = (
    "CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12, 2))"
)
DECODE_INSERT = (  # the decode benchmark's rows
    "INSERT INTO bench SELECT g, (g * 7919) %% 100000, md5(g::text),"
    " timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',"
    " (g %% 10000000) / 100.0 FROM generate_series(%s::bigint, %s::bigint) g"
)
COPY_INSERT = (  # the copy benchmark's rows (~510 MB at 5,000,000)
    "INSERT INTO bench SELECT g, g %% 1000, 'row ' || g || ' ' || md5(g::text), "
    "timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', "
    "(g %% 100000) / 100.0 FROM generate_series(%s::bigint, %s::bigint) g"
)


@dataclass(frozen=True, slots=True)
class Checksum:
    count: int
    sum_id: int
    sum_amount: Decimal  # of the table's numeric column: orders.amount, bench.d

    def as_json(self) -> dict[str, Any]:
        return {"count": self.count, "sum_id": self.sum_id, "sum_amount": str(self.sum_amount)}


def checksum(
    conn: psycopg.Connection[Any], table: str = ORDERS, amount: str = "amount"
) -> Checksum:
    row = conn.execute(
        f"SELECT count(*), coalesce(sum(id), 0), coalesce(sum({amount}), 0) FROM {table}"
    ).fetchone()
    assert row is not None
    return Checksum(int(row[0]), int(row[1]), Decimal(row[2]))


def iceberg_checksum(catalog: Any, table: str = ORDERS, amount: str = "amount") -> Checksum:
    """The same checksum over the Iceberg copy (``public.<table>``), as a reader sees it."""
    import pyarrow.compute as pc

    arrow = catalog.load_table(("public", table)).scan(selected_fields=("id", amount)).to_arrow()
    sum_id = pc.sum(arrow.column("id")).as_py() or 0
    sum_amount = pc.sum(arrow.column(amount)).as_py() or Decimal(0)
    return Checksum(arrow.num_rows, int(sum_id), Decimal(sum_amount))


@dataclass(slots=True)
class Backlog:
    """What a consumer is given to replicate, and what its copy must then hold."""

    workload: str
    rows: int  # rows inserted
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    transactions: int = 0
    seconds: float = 0.0
    start_lsn: Lsn = INVALID_LSN
    endpos: Lsn = INVALID_LSN  # the end marker: pg_recvlogical's --endpos
    target: Lsn = INVALID_LSN  # WAL insert position after the backlog
    # WAL insert position right after the last transaction's commit (before the end
    # marker): the end of that commit record, the position a consumer acknowledges
    # once it has applied the backlog (the live benchmarks' target).
    last_commit: Lsn = INVALID_LSN
    expected: Checksum | None = None
    table: str = ORDERS
    amount: str = "amount"  # the numeric column the checksum sums

    @property
    def changes(self) -> int:
        return self.inserts + self.updates + self.deletes

    @property
    def wal_bytes(self) -> int:
        return int(self.target) - int(self.start_lsn)

    def verify(self, who: str, got: Checksum) -> None:
        if got != self.expected:
            raise SystemExit(f"{who}: copy differs from the publisher: {got} != {self.expected}")

    def as_json(self) -> dict[str, Any]:
        return {
            "inserts": self.inserts,
            "updates": self.updates,
            "deletes": self.deletes,
            "changes": self.changes,
            "transactions": self.transactions,
            "wal_bytes": self.wal_bytes,
            "start_lsn": str(self.start_lsn),
            "last_commit_lsn": str(self.last_commit),
            "target_lsn": str(self.target),
            "write_seconds": round(self.seconds, 3),
            "expected": self.expected.as_json() if self.expected else None,
        }


def prefill(dsn: str, rows: int) -> None:
    """The same deterministic ``orders`` rows on the publisher and on a subscriber."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE orders")
        conn.execute(ORDERS_INSERT, (1, rows))
        conn.execute("VACUUM ANALYZE orders")
        conn.execute("CHECKPOINT")


def write_backlog(dsn: str, workload: str, rows: int, updates: int = 20_000) -> Backlog:
    """One of WORKLOADS on ``orders`` (see bench/README.md), ended by a logical message."""
    b = Backlog(workload, 0 if workload in PREFILLED else rows)
    with psycopg.connect(dsn, autocommit=True) as conn:
        b.start_lsn = insert_lsn(conn)
        t = time.perf_counter()
        if workload == "bulk":
            b.inserts = conn.execute(ORDERS_INSERT, (1, rows)).rowcount
            b.transactions = 1
        elif workload == "update":
            b.updates = conn.execute(
                "UPDATE orders SET amount = amount + 1, status = 'updated'"
            ).rowcount
            b.transactions = 1
        elif workload == "scatter":
            rnd = random.Random(SCATTER_SEED)
            for _ in range(updates):
                b.updates += conn.execute(
                    "UPDATE orders SET amount = amount + 1, status = 'scattered' WHERE id = %s",
                    (rnd.randint(1, rows),),
                ).rowcount
                b.transactions += 1
        else:
            _write_mixed(conn, b, rows)
        b.seconds = time.perf_counter() - t
        end_backlog(conn, b, "apply_bench")
    return b


def end_backlog(conn: psycopg.Connection[Any], b: Backlog, prefix: str) -> None:
    """After the load's last commit: its position, the end message (``prefix``) and
    its position, the target, the expected checksum; then vacuum and a checkpoint."""
    b.last_commit = insert_lsn(conn)
    # pgoutput sends a non-transactional message at once, in an XLogData whose
    # position is the end of its record: the value this function returns.
    row = conn.execute(f"SELECT pg_logical_emit_message(false, '{prefix}', 'end')::text").fetchone()
    assert row is not None
    b.endpos = Lsn.parse(str(row[0]))
    b.target = insert_lsn(conn)
    b.expected = checksum(conn)
    conn.execute(f"VACUUM ANALYZE {ORDERS}")  # not autovacuum during a measurement
    conn.execute("CHECKPOINT")


def _write_mixed(conn: psycopg.Connection[Any], b: Backlog, rows: int) -> None:
    block_start = 1
    for lo in range(1, rows + 1, TXN_ROWS):
        hi = min(lo + TXN_ROWS - 1, rows)
        b.inserts += conn.execute(ORDERS_INSERT, (lo, hi)).rowcount
        b.transactions += 1
        if hi - block_start + 1 >= BLOCK_ROWS or hi == rows:
            b.updates += conn.execute(MIXED_UPDATE, (block_start, hi)).rowcount
            b.deletes += conn.execute(MIXED_DELETE, (block_start, hi)).rowcount
            b.transactions += 2
            block_start = hi + 1


def describe(b: Backlog) -> str:
    """One line saying what the backlog is."""
    if b.workload == "bulk":
        return f"{b.rows:,} rows inserted in one transaction"
    if b.workload in PREFILLED:
        return f"{b.updates:,} updates in {b.transactions:,} transaction(s) on a prefilled table"
    return (
        f"{b.inserts:,} inserts in transactions of {TXN_ROWS:,}, {b.updates:,}"
        f" updates, {b.deletes:,} deletes ({b.transactions:,} transactions)"
    )


def load_bench_table(pub: EmbeddedPostgres, rows: int) -> Backlog:
    """``bench`` with ``rows`` rows (the copy benchmark's), frozen, published and read
    once: the copy a consumer must then hold."""
    with psycopg.connect(pub.dsn(), autocommit=True) as conn:
        conn.execute(BENCH_DDL)
        t = time.perf_counter()
        step = 1_000_000
        for lo in range(1, rows + 1, step):
            conn.execute(COPY_INSERT, (lo, min(rows, lo + step - 1)))
        log(f"loaded {rows:,} rows in {time.perf_counter() - t:.1f}s")
        t = time.perf_counter()
        conn.execute(f"VACUUM (FREEZE, ANALYZE) {BENCH}")
        size = conn.execute(f"SELECT pg_size_pretty(pg_table_size('{BENCH}'))").fetchone()
        log(f"vacuumed in {time.perf_counter() - t:.1f}s; table size {size[0] if size else '?'}")
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {BENCH}")
        expected = checksum(conn, BENCH, "d")  # also warms the page cache
    return Backlog("copy", rows, inserts=rows, expected=expected, table=BENCH, amount="d")
