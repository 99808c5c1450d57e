"""A publisher that fails over to its standby, a slot that goes missing, a connection
that goes silent: real servers, real faults, the mirror exact afterwards.

Failover: a PostgreSQL 17 (and 18) primary with a physical standby that syncs failover
slots (``sync_replication_slots``), the primary holding logical walsenders back until
the standby has the WAL (``synchronized_standby_slots``). sparkapply follows the
primary through a multi-host DSN (``target_session_attrs=read-write``). The standby is
a cold copy of the primary's data directory (the npm builds of 17 and 18 ship no
``pg_basebackup``), made before any logical slot exists.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sparkapply.embedded import EmbeddedPostgres, installed_bin_dir
from sparkapply.errors import SlotError
from sparkapply.lsn import Lsn
from sparkapply.run.subscriber import Subscriber
from tests.mirror import Mirror, Running, copy_snapshots, wait_until

pytestmark = pytest.mark.integration

SCHEMA = (
    "CREATE TABLE acct (id int PRIMARY KEY, balance bigint NOT NULL, note text)",
    "CREATE TABLE log (id bigint PRIMARY KEY, body text)",
    "INSERT INTO acct SELECT g, 1000, 'seed' FROM generate_series(1, 200) g",
    "CREATE PUBLICATION pub FOR TABLE acct, log",
)


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _insert_lsn(dsn: str) -> Lsn:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(row[0])


class Pair:
    """A primary and its standby, on ports of their own."""

    def __init__(self, root: Path, major: int) -> None:
        bin_dir = installed_bin_dir(major)
        common = {
            "logical_decoding_work_mem": "64kB",
            "wal_sender_timeout": "20s",
            "hot_standby_feedback": "on",
        }
        self.primary = EmbeddedPostgres(root / "primary", settings=common, bin_dir=bin_dir)
        self.primary.start()
        _sql(self.primary.dsn(), "SELECT pg_create_physical_replication_slot('standby', true)")
        self.primary.stop()
        # A cold copy, owned as the server's user owns the primary's; without the
        # primary's slots (a standby keeps none of its own).
        subprocess.run(["cp", "-a", str(root / "primary"), str(root / "standby")], check=True)
        for slot in (root / "standby" / "pg_replslot").iterdir():
            shutil.rmtree(slot)
        signal_file = root / "standby" / "standby.signal"
        signal_file.touch()
        shutil.copystat(root / "standby" / "PG_VERSION", signal_file)
        os.chown(signal_file, *_owner(root / "standby" / "PG_VERSION"))
        self.primary.settings["synchronized_standby_slots"] = "standby"
        self.primary.start()
        self.standby = EmbeddedPostgres(
            root / "standby",
            bin_dir=bin_dir,
            settings={
                **common,
                "primary_conninfo": f"{self.primary.dsn()} application_name=standby",
                "primary_slot_name": "standby",
                "sync_replication_slots": "on",
            },
        )
        self.standby.start()

    def dsn(self) -> str:
        """Both servers; libpq connects to whichever takes writes."""
        p, s = self.primary.port, self.standby.port
        return (
            f"host=127.0.0.1,127.0.0.1 port={p},{s} user=postgres dbname=postgres "
            "target_session_attrs=read-write"
        )

    def promote(self) -> None:
        self.primary.stop("immediate")
        self.standby._run("pg_ctl", "promote", "-D", str(self.standby.data_dir), "-w")

    def stop(self) -> None:
        self.primary.stop("immediate")
        self.standby.stop("immediate")


def _owner(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid


@pytest.fixture(params=(17, 18), ids=lambda v: f"pg{v}")
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    root = Path(tempfile.mkdtemp(prefix="sparkapply-test-failover-"))
    os.chmod(root, 0o755)  # the servers may run as another user (see sparkapply.embedded)
    servers = Pair(root, request.param)
    try:
        yield servers
    finally:
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)


def _synced(standby: EmbeddedPostgres, slot: str, at_least: Lsn) -> bool:
    with psycopg.connect(standby.dsn()) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = %s AND synced AND NOT temporary",
            (slot,),
        ).fetchone()
    return row is not None and row[0] is not None and Lsn.parse(row[0]) >= at_least


def test_a_promoted_standby_carries_the_mirror_on_without_a_copy(
    pair: Pair, tmp_path: Path, spark: Any
) -> None:
    primary = pair.primary.dsn()
    _sql(primary, *SCHEMA)
    mirror = Mirror(pair.dsn(), tmp_path / "work", spark, slot="mirror")
    mirror.config = replace(
        mirror.config, source=replace(mirror.config.source, reconnect_max_backoff=1.0)
    )
    run = Running(Subscriber(mirror.config, spark=spark))
    wait_until(lambda: run.sub.summary.streaming_started > 0, "streaming to start")
    with psycopg.connect(primary) as conn:
        assert conn.execute(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = 'mirror'"
        ).fetchone() == (True,)

    # Before the failover: small transactions, a streamed one, a prepared one.
    _sql(
        primary,
        "UPDATE acct SET balance = balance - 10 WHERE id <= 50",
        "INSERT INTO log SELECT g, repeat('x', 50) FROM generate_series(1, 5000) g",
        "BEGIN",
        "UPDATE acct SET note = 'prepared' WHERE id = 7",
        "PREPARE TRANSACTION 'across'",
    )
    before = _insert_lsn(primary)
    run.wait_flushed(before)
    wait_until(lambda: _synced(pair.standby, "mirror", before), "the slot to reach the standby")

    pair.promote()
    new_primary = pair.standby.dsn()
    _sql(
        new_primary,
        "COMMIT PREPARED 'across'",
        "UPDATE acct SET balance = balance + 1 WHERE id % 3 = 0",
        "DELETE FROM log WHERE id % 7 = 0",
        "INSERT INTO log SELECT g, 'after' FROM generate_series(5001, 9000) g",
    )
    run.wait_flushed(_insert_lsn(new_primary))
    run.stop()
    mirror.catalog = run.sub.catalog

    assert run.sub.summary.reconnects >= 1
    # The run went on from the synced slot: each table was copied once, at the start.
    for table in ("acct", "log"):
        assert len(copy_snapshots(mirror, f"public.{table}")) == 1, table
    mirror.dsn = new_primary
    mirror.assert_mirrored("public.acct", "public.log")


def test_a_missing_slot_is_never_silent(pg_dsn: str, tmp_path: Path, spark: Any) -> None:
    _sql(pg_dsn, *SCHEMA)
    mirror = Mirror(pg_dsn, tmp_path / "work", spark)
    mirror.run()
    mirror.sql(f"SELECT pg_drop_replication_slot('{mirror.slot}')", "UPDATE acct SET note = 'x'")

    stopping = replace(mirror.config, source=replace(mirror.config.source, missing_slot="stop"))
    with pytest.raises(SlotError, match=f"replication slot '{mirror.slot}' is missing"):
        Subscriber(stopping, spark=spark, catalog=mirror.catalog).run(until_caught_up=True)
    with psycopg.connect(pg_dsn) as conn:  # stopped before making one
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)

    sub = Subscriber(mirror.config, spark=spark, catalog=mirror.catalog)
    sub.run(until_caught_up=True)
    assert sub.metrics.slot_missing._value.get() == 1
    for table in ("acct", "log"):
        assert len(copy_snapshots(mirror, f"public.{table}")) == 2, table  # copied again
    mirror.assert_mirrored("public.acct", "public.log")


def test_a_silent_connection_is_dropped_and_made_again(
    pg_dsn: str, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _sql(pg_dsn, *SCHEMA)
    mirror = Mirror(pg_dsn, tmp_path / "work", spark)
    config = replace(
        mirror.config,
        source=replace(mirror.config.source, receive_timeout=3.0, reconnect_max_backoff=1.0),
    )
    run = Running(Subscriber(config, spark=spark))
    wait_until(lambda: run.sub.summary.streaming_started > 0, "streaming to start")
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (mirror.slot,)
        ).fetchone()
    assert row is not None and row[0]
    walsender = int(row[0])
    # The walsender stops mid-session: the socket stays open and nothing arrives, as
    # behind a partition that sends no reset.
    caplog.set_level(logging.WARNING, logger="sparkapply")
    os.kill(walsender, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        _sql(pg_dsn, "UPDATE acct SET balance = 1 WHERE id = 1")
        wait_until(lambda: run.sub.summary.reconnects >= 1, "the dead connection to be seen", 30)
        detected = time.monotonic() - stopped
    finally:
        os.kill(walsender, signal.SIGCONT)  # it finds its client gone, and lets the slot go
    assert 3.0 <= detected < 10.0, detected
    assert any("connection is taken for dead" in r.getMessage() for r in caplog.records)
    _sql(pg_dsn, "UPDATE acct SET balance = 2 WHERE id = 2")
    run.wait_flushed(_insert_lsn(pg_dsn))
    run.stop()
    mirror.catalog = run.sub.catalog
    mirror.assert_mirrored("public.acct", "public.log")
    reconnects = run.sub.summary.reconnects
    print(f"silent connection detected after {detected:.1f} s, {reconnects} reconnect(s)")
