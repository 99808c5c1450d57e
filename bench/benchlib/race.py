"""The race: a live ``sparkapply run`` and PostgreSQL's native subscriber drain the
same backlog, one round at a time (see bench/README.md, ``race_bench.py``).

A round, with fresh consumers:

1. ``sparkapply run`` starts (its slot, its initial copy of the tables) and the native
   subscription is created (``copy_data = true``); both take one small warm-up
   transaction, applied and acknowledged (sparkapply's first batch: Spark's workers
   started, its modules imported, its tables loaded).
2. Both stop consuming: sparkapply is frozen (SIGSTOP of its process tree and of its
   walsender, once it is idle), the native subscription disabled.
3. The load is written; its end (the *target*) is the WAL insert position right after
   its last commit: the end of that commit record, which is what a consumer
   acknowledges once it has applied the last transaction.
4. One consumer at a time (the machine has 2 cores), in an order that alternates
   between rounds: released (SIGCONT) or enabled, and timed until its slot's
   ``confirmed_flush_lsn`` on the publisher reaches the target (polled every 10 ms);
   sparkapply is frozen again while the native subscriber drains.
5. Both copies are checked against the publisher (count and sums of every table).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import psycopg

from benchlib import applog, pgbench
from benchlib.consumers import Run
from benchlib.live import (
    LiveConsumer,
    NativeSubscription,
    SlotWatch,
    SparkapplyProcess,
    cleanup,
    iceberg_sums,
    table_sums,
)
from benchlib.metering import CpuMeter, loadavg, wait_quiet
from benchlib.report import log
from benchlib.servers import PUBLICATION, insert_lsn, postmaster_pid, publish
from benchlib.workloads import (
    ORDERS,
    ORDERS_DDL,
    PREFILLED,
    Backlog,
    prefill,
    write_backlog,
)
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.state.batch_log import read_batch_log

WARM_UP = (  # one transaction: an insert (or update) and an update of row 0
    "INSERT INTO orders VALUES (0, 0, 0.00, 'warm', timestamptz '2024-01-01 00:00:00+00',"
    " 'warm-up') ON CONFLICT (id) DO UPDATE SET note = 'warm-up again'",
    "UPDATE orders SET status = 'warmed' WHERE id = 0",
)


class RaceWorkload(Protocol):
    name: str
    tables: dict[str, tuple[str, ...]]  # table -> columns its checksum sums

    def setup(self, pub: EmbeddedPostgres, sub: EmbeddedPostgres) -> None:
        """Tables and publication, once."""

    def before_round(self, pub: EmbeddedPostgres, sub: EmbeddedPostgres) -> None:
        """Before a round's consumers exist."""

    def warm_up(self, pub: EmbeddedPostgres) -> None:
        """One small transaction."""

    def load(self, pub: EmbeddedPostgres) -> Backlog:
        """The backlog; its ``last_commit`` is the target."""

    def describe(self, backlog: Backlog) -> str: ...


@dataclass(slots=True)
class OrdersWorkload:
    """bulk, update, scatter, mixed: ``benchlib.workloads``' definitions, as in
    ``apply_bench.py``."""

    name: str
    rows: int
    updates: int = 20_000
    tables: dict[str, tuple[str, ...]] = field(default_factory=lambda: {ORDERS: ("id", "amount")})

    def setup(self, pub: EmbeddedPostgres, sub: EmbeddedPostgres) -> None:
        publish(pub.dsn(), ORDERS_DDL, ORDERS)
        with psycopg.connect(sub.dsn(), autocommit=True) as conn:
            conn.execute(ORDERS_DDL)
        if self.name in PREFILLED:
            prefill(pub.dsn(), self.rows)

    def before_round(self, pub: EmbeddedPostgres, sub: EmbeddedPostgres) -> None:
        if self.name not in PREFILLED:  # bulk and mixed insert ids 1..rows again
            with psycopg.connect(pub.dsn(), autocommit=True) as conn:
                conn.execute(f"TRUNCATE {ORDERS}")
        with psycopg.connect(sub.dsn(), autocommit=True) as conn:
            conn.execute(f"TRUNCATE {ORDERS}")  # the subscription copies it

    def warm_up(self, pub: EmbeddedPostgres) -> None:
        with psycopg.connect(pub.dsn()) as conn:  # one transaction
            for statement in WARM_UP:
                conn.execute(statement)

    def load(self, pub: EmbeddedPostgres) -> Backlog:
        return write_backlog(pub.dsn(), self.name, self.rows, self.updates)

    def describe(self, backlog: Backlog) -> str:
        from benchlib.workloads import describe

        return describe(backlog)


@dataclass(slots=True)
class PgbenchWorkload:
    """pgbench's TPC-B-like transactions: ``-c clients``, ``transactions`` in all."""

    scale: int = 1
    transactions: int = 20_000
    clients: int = 4
    name: str = "pgbench"
    tables: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(pgbench.TABLES))
    output: str = ""

    def setup(self, pub: EmbeddedPostgres, sub: EmbeddedPostgres) -> None:
        pgbench.init(pub, self.scale)
        with psycopg.connect(pub.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(self.tables)}")
        pgbench.init(sub, self.scale, steps="dtp")

    def before_round(self, pub: EmbeddedPostgres, sub: EmbeddedPostgres) -> None:
        with psycopg.connect(sub.dsn(), autocommit=True) as conn:
            conn.execute(f"TRUNCATE {', '.join(self.tables)}")

    def warm_up(self, pub: EmbeddedPostgres) -> None:
        pgbench.run(pub, "-n", "-c", "1", "-t", "1")

    def load(self, pub: EmbeddedPostgres) -> Backlog:
        per_client = math.ceil(self.transactions / self.clients)
        total = per_client * self.clients
        b = Backlog("pgbench", 0, inserts=total, updates=3 * total, transactions=total)
        with psycopg.connect(pub.dsn(), autocommit=True) as conn:
            b.start_lsn = insert_lsn(conn)
            t = time.perf_counter()
            self.output = pgbench.run(pub, "-n", "-c", str(self.clients), "-t", str(per_client))
            b.seconds = time.perf_counter() - t
            b.endpos = b.target = b.last_commit = insert_lsn(conn)
            conn.execute(f"VACUUM ANALYZE {', '.join(self.tables)}")
            conn.execute("CHECKPOINT")
        return b

    def describe(self, backlog: Backlog) -> str:
        return (
            f"pgbench (TPC-B-like, scale {self.scale}): {backlog.transactions:,}"
            f" transactions from {self.clients} clients"
        )


@dataclass(frozen=True, slots=True)
class RaceOptions:
    maintenance: bool = True  # sparkapply's [maintenance] enabled (its default: on)
    cuts: bool = True  # one catalog transaction per batch with its cut (the default)
    freeze_walsender: bool = True  # SIGSTOP sparkapply's walsender with it
    native_synchronous_commit: str = "on"  # the subscription's synchronous_commit
    timeout: float = 1800.0  # per drain
    setup_timeout: float = 1800.0  # consumers' start, copy and warm-up
    # py-spy samples sparkapply's driver through each drain into this directory
    # (collapsed stacks, one file a round); None: no profiler.
    py_spy: Path | None = None


def order_of(first: str, index: int) -> tuple[str, str]:
    """Which consumer drains first in round ``index``: ``first`` is ``native``,
    ``sparkapply`` or ``alternate`` (sparkapply in even rounds, native in odd ones)."""
    native_first = first == "native" or (first == "alternate" and index % 2 == 1)
    return ("native", "sparkapply") if native_first else ("sparkapply", "native")


def _equal(a: list[str], b: list[str]) -> bool:
    return [Decimal(x) for x in a] == [Decimal(x) for x in b]


class Round:
    """One round's consumers, from creation to verification. ``close()`` ends them."""

    def __init__(
        self,
        index: int,
        pub: EmbeddedPostgres,
        sub: EmbeddedPostgres,
        root: Path,
        workload: RaceWorkload,
        options: RaceOptions,
    ) -> None:
        self.index = index
        self.pub, self.sub = pub, sub
        self.workload = workload
        self.options = options
        self.watch = SlotWatch(pub.dsn())
        self.sparkapply = SparkapplyProcess(
            root / f"round-{index}",
            pub,
            f"sparkapply_r{index}",
            maintenance=options.maintenance,
            freeze_walsender=options.freeze_walsender,
            cuts=options.cuts,
        )
        self.native: NativeSubscription | None = None
        self.expected: dict[str, list[str]] = {}
        self.setup_seconds: dict[str, float] = {}

    def close(self) -> None:
        """End the round's consumers: the process, the subscription, the slot."""
        native = self.native
        cleanup(
            self.sparkapply.stop,
            native.close if native is not None else lambda: None,
            lambda: self.watch.drop_slot(self.sparkapply.slot),
            self.watch.close,
        )

    # -- setup -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Both consumers started, copied, warmed by one transaction, then stopped."""
        self.workload.before_round(self.pub, self.sub)
        t0 = time.monotonic()
        sa = self.sparkapply
        sa.start()
        self.native = native = NativeSubscription(
            self.pub,
            self.sub,
            f"native_r{self.index}",
            synchronous_commit=self.options.native_synchronous_commit,
        )
        native.create()
        timeout = self.options.setup_timeout
        native.wait_ready(timeout)
        self.setup_seconds["native_copy"] = time.monotonic() - t0
        self.watch.wait_slot(sa.slot, timeout=timeout, check=sa.check)
        self.workload.warm_up(self.pub)
        warm = self.watch.insert_lsn()
        self.watch.wait(sa.slot, warm, timeout=timeout, check=sa.check, what="sparkapply warm-up")
        self.setup_seconds["sparkapply_start_copy_warm_up"] = time.monotonic() - t0
        self.watch.wait(native.slot, warm, timeout=timeout, check=native.check, what="native")
        self.setup_seconds["sparkapply_quiet_wait"] = wait_quiet(sa.pid)
        sa.pause()
        native.pause()
        with psycopg.connect(self.sub.dsn(), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        log(
            f"round {self.index}: consumers ready ("
            + ", ".join(f"{k} {v:.1f}s" for k, v in self.setup_seconds.items())
            + ")"
        )

    def load(self) -> Backlog:
        backlog = self.workload.load(self.pub)
        with psycopg.connect(self.pub.dsn(), autocommit=True) as conn:
            self.expected = {t: table_sums(conn, t, c) for t, c in self.workload.tables.items()}
        return backlog

    # -- the drains --------------------------------------------------------------------

    def drain_sparkapply(self, backlog: Backlog, *, pause_after: bool) -> Run:
        sa = self.sparkapply
        state = self.watch.slot(sa.slot)
        walsender = sa.walsender_pid or (state[1] if state else None)
        sent = None if walsender is None else self.watch.sent(walsender)
        with self._sampled(sa.pid):
            d = self._drain(sa, sa.pid, backlog, "sparkapply")
        seconds = d.reached - d.t0
        if pause_after:
            sa.pause()
        # WAL of the load its walsender had decoded and sent before the release.
        ahead = 0 if sent is None else min(int(sent), int(backlog.last_commit))
        head_start = max(0, ahead - int(backlog.start_lsn))
        detail = {
            "walsender_frozen": sa.walsender_pid is not None,
            "walsender_head_start_bytes": head_start,
            "log": self._log_since(d.released_wall, seconds),
        }
        return Run(seconds, d.load, d.cpu.as_dict(), detail=detail)

    @contextlib.contextmanager
    def _sampled(self, pid: int) -> Iterator[None]:
        """py-spy on the driver and its Python workers while the block runs
        (``RaceOptions.py_spy``): where their threads spend the drain, as collapsed
        stacks (``--threads --idle --subprocesses``, 1 kHz).
        It attaches before the release, so the drain is what it sees."""
        out_dir = self.options.py_spy
        if out_dir is None:
            yield
            return
        if shutil.which("py-spy") is None:
            raise SystemExit("--py-spy needs py-spy on PATH: pip install py-spy")
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"round{self.index}.txt"
        spy = subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--rate",
                "1000",
                "--format",
                "raw",
                "--threads",
                "--idle",
                "--nonblocking",
                "--subprocesses",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached
        try:
            yield
        finally:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)

    def _log_since(self, released_wall: float, seconds: float) -> dict[str, Any]:
        """The log's records from the release on, and when the target was seen."""
        try:
            text = self.sparkapply.log_path.read_text(errors="replace")
        except OSError:
            return {}
        records = read_batch_log(self.sparkapply.work_dir, released_wall)
        out = applog.timeline(applog.parse_log(text), records, released_wall)
        out["target_seen_at"] = round(seconds, 3)
        out["split"] = applog.split(out["batches"], seconds)
        return out

    def drain_native(self, backlog: Backlog) -> Run:
        native = self.native
        assert native is not None
        d = self._drain(native, postmaster_pid(self.sub), backlog, "native")
        native.check()
        detail = {
            "worker_connected_seconds": None if d.active is None else round(d.active - d.t0, 3),
            "parallel_apply_workers_seen": native.parallel_workers_seen,
        }
        return Run(d.reached - d.t0, d.load, d.cpu.as_dict(), detail=detail)

    def _drain(self, consumer: LiveConsumer, root: int, backlog: Backlog, what: str) -> _Drain:
        """Release ``consumer`` (its processes under ``root``) and wait until its slot
        confirms the backlog's last commit, metering CPU meanwhile."""
        load = loadavg()
        with CpuMeter(root, postmaster_pid(self.pub)) as cpu:
            released_wall = time.time()
            t0 = time.monotonic()
            consumer.resume()
            reached, active = self.watch.wait(
                consumer.slot,
                backlog.last_commit,
                timeout=self.options.timeout,
                check=consumer.check,
                what=what,
            )
        return _Drain(load, cpu, released_wall, t0, reached, active)

    # -- verification --------------------------------------------------------------------

    def verify(self) -> dict[str, Any]:
        """Every table of both copies against the publisher's checksum (count, sums)."""
        from sparkapply.config import load_config
        from sparkapply.sink.catalog import open_catalog

        self.sparkapply.resume()
        native_got: dict[str, list[str]] = {}
        with psycopg.connect(self.sub.dsn(), autocommit=True) as conn:
            for table, cols in self.workload.tables.items():
                native_got[table] = table_sums(conn, table, cols)
        config = load_config(self.sparkapply.config_path, env={})
        catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
        sa_got = {t: iceberg_sums(catalog, t, c) for t, c in self.workload.tables.items()}
        for who, got in (("native", native_got), ("sparkapply", sa_got)):
            for table, want in self.expected.items():
                if not _equal(got[table], want):
                    raise SystemExit(
                        f"round {self.index}: {who}'s {table} differs from the publisher:"
                        f" {got[table]} != {want} (count, sums of {self.workload.tables[table]})"
                    )
        return {"tables": self.expected}


@dataclass(frozen=True, slots=True)
class _Drain:
    """One consumer's drain: the load before it, its CPU, when it was released (wall
    clock, monotonic), when its slot reached the target and when (if seen) its worker
    connected."""

    load: float
    cpu: CpuMeter
    released_wall: float
    t0: float
    reached: float
    active: float | None
