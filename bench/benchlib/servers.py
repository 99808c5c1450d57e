"""The bundled PostgreSQL servers a benchmark starts, with the benchmark settings.

Every benchmark works in a scratch directory of its own and starts its servers there
(``sparkapply.embedded``): no running server is needed and the test server is left
alone. As root the servers run as ``nobody``, hence the directory's mode.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from sparkapply.embedded import EmbeddedPostgres
from sparkapply.lsn import Lsn

SETTINGS = {
    "logical_decoding_work_mem": "64MB",
    "debug_logical_replication_streaming": "buffered",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "wal_sender_timeout": "0",
    "wal_receiver_timeout": "0",
    # A vacuum of a 1M-row table started by one measurement must not run during the
    # next one; the publisher's table is vacuumed once, by hand, before measuring.
    "autovacuum": "off",
}
SUBSCRIBER_SETTINGS = {  # a native subscriber with parallel apply workers
    **SETTINGS,
    "max_logical_replication_workers": "8",
    "max_parallel_apply_workers_per_subscription": "2",
    "max_worker_processes": "16",
}
PUBLICATION = "bench_pub"


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary directory the servers' user can enter; removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def server(data_dir: Path, settings: Mapping[str, str] = SETTINGS) -> Iterator[EmbeddedPostgres]:
    """A started server, stopped at once (``immediate``) afterwards."""
    pg = EmbeddedPostgres(data_dir, settings=dict(settings))
    pg.start()
    try:
        yield pg
    finally:
        pg.stop("immediate")


def postmaster_pid(pg: EmbeddedPostgres) -> int:
    return int((pg.data_dir / "postmaster.pid").read_text().split()[0])


def publish(dsn: str, ddl: str, table: str) -> None:
    """``ddl``, then the benchmark's publication of ``table``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ddl)
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {table}")


def insert_lsn(conn: psycopg.Connection[Any]) -> Lsn:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(str(row[0]))


def create_slot(dsn: str, slot: str) -> None:
    """A pgoutput slot (two-phase, like sparkapply's), created before any load."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", (slot,)
        )


def confirmed_flush(dsn: str, slot: str) -> Lsn:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None and row[0] is not None
    return Lsn.parse(str(row[0]))


# The live benchmarks (race, freshness): neither side fsyncs (see bench/README.md,
# "Durability"). The publisher commits with synchronous_commit = on, so a committed
# transaction's WAL is written (to the OS) when its COMMIT returns: what "written"
# means to the freshness benchmark. The native subscriber's apply workers take the
# subscription's own synchronous_commit (benchlib.live.NativeSubscription).
LIVE_DURABILITY = {"fsync": "off", "synchronous_commit": "on", "full_page_writes": "off"}
LIVE_PUBLISHER = {**SETTINGS, **LIVE_DURABILITY}
LIVE_SUBSCRIBER = {**SUBSCRIBER_SETTINGS, **LIVE_DURABILITY}
