"""Running it in production: status, metrics, skipping a poison transaction, and
errors that stop (an operator must act) versus errors that are retried."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from sparkapply.commands.status import gather
from sparkapply.config import MetricsConfig
from sparkapply.errors import (
    CommitConflictError,
    CommitOutcomeUnknownError,
    ConversionError,
    ErrorKind,
)
from sparkapply.lsn import Lsn
from sparkapply.run.errors import spark_job_error
from sparkapply.run.subscriber import Subscriber
from tests.mirror import Mirror, Running, cli
from tests.mirror import wait_until as _wait

pytestmark = pytest.mark.integration


def _slot_pid(mirror: Mirror) -> int | None:
    with psycopg.connect(mirror.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (mirror.slot,)
        ).fetchone()
    return None if row is None else row[0]


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_status_and_metrics_while_running_and_after(mirror: Mirror, tmp_path: Path) -> None:
    mirror.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION pub FOR TABLE t")
    mirror.run()
    config = dataclasses.replace(mirror.config, metrics=MetricsConfig(port=0))
    running = Running(Subscriber(config, spark=mirror.spark, catalog=mirror.catalog))
    try:
        _wait(lambda: running.sub.metrics.port is not None, "the metrics endpoint")
        port = running.sub.metrics.port
        assert port is not None
        mirror.sql(
            "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 500) g",
            "UPDATE t SET v = 'w' WHERE id <= 100",
            "DELETE FROM t WHERE id > 450",
        )
        with psycopg.connect(mirror.dsn, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (9999, 'prepared')")
            conn.execute("PREPARE TRANSACTION 'gx'")
        target = mirror.insert_lsn()
        running.wait_flushed(target)

        m = _scrape(port)
        flushed = m[("sparkapply_flushed_lsn", ())]
        assert flushed >= int(target)
        assert m[("sparkapply_received_lsn", ())] >= flushed
        assert m[("sparkapply_lag_bytes", ())] >= 0
        assert m[("sparkapply_prepared_pending", ())] == 1
        assert ("sparkapply_spool_bytes", ()) in m
        assert m[("sparkapply_reconnects_total", ())] == 0
        assert m[("sparkapply_transactions_applied_total", ())] >= 3
        assert m[("sparkapply_rows_written_total", (("table", "public.t"),))] >= 450
        assert ("sparkapply_rows_removed_total", (("table", "public.t"),)) in m
        assert m[("sparkapply_batch_seconds_count", ())] >= 1
        assert m[("sparkapply_iceberg_commit_seconds_count", ())] >= 1
        assert m[("sparkapply_batch_seconds_sum", ())] > 0
        assert m[("sparkapply_lag_seconds", ())] >= 0

        status = gather(config, mirror.catalog)
        assert status.slot.exists and status.slot.active
        assert status.slot.lag_bytes is not None and status.slot.lag_bytes >= 0
        assert status.slot.retained_bytes is not None and status.slot.retained_bytes >= 0
        (table,) = status.tables
        assert (table.source, table.iceberg, table.exists) == ("public.t", "public.t", True)
        assert table.rows == 450
        assert table.data_files is not None and table.data_files >= 1
        assert table.delete_files == 0
        assert table.applied_lsn is not None and Lsn.parse(table.applied_lsn) < target
        assert table.last_commit is not None
        assert dt.datetime.now(dt.UTC) - table.last_commit < dt.timedelta(minutes=5)
        assert status.commits.startswith("atomic")
        assert status.latest_cut is not None and Lsn.parse(status.latest_cut) < target
        assert status.latest_cut == table.applied_lsn  # the table's last batch cut there
        (prepared,) = status.prepared
        assert prepared.gid == "gx"
        assert dt.datetime.now(dt.UTC) - prepared.since < dt.timedelta(minutes=5)
        # Rows replaced by a later batch stay in their files until compaction, named
        # by position deletes: status counts the table's rows, not its records.
        mirror.sql("UPDATE t SET v = 'x' WHERE id <= 200")
        running.wait_flushed(mirror.insert_lsn())
        (table,) = gather(config, mirror.catalog).tables
        assert table.delete_files is not None and table.delete_files >= 1
        assert table.rows == 450
    finally:
        running.stop()
    # The endpoint is gone with the run.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)

    _wait(lambda: _slot_pid(mirror) is None, "the walsender to let go of the slot", 30)
    cfg = mirror.write_config(tmp_path / "status.toml")
    proc = cli("status", "--config", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    assert data["slot"]["exists"] and not data["slot"]["active"]
    assert data["tables"][0]["rows"] == 450
    assert data["prepared"][0]["gid"] == "gx"
    assert data["commits"].startswith("atomic") and data["latest_cut"] is not None
    proc = cli("status", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "inactive" in proc.stdout and "public.t" in proc.stdout and "gx" in proc.stdout
    assert "450" in proc.stdout
    assert f"cuts       latest at {data['latest_cut']}" in proc.stdout
    mirror.sql("COMMIT PREPARED 'gx'")


def test_poison_transaction_is_named_skipped_and_acknowledged(
    mirror: Mirror, tmp_path: Path
) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, n int[])",
        "CREATE TABLE u (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE t, u",
        "INSERT INTO t VALUES (1, '{1}'), (2, '{2}')",
    )
    mirror.run()
    with psycopg.connect(mirror.dsn, autocommit=True) as conn, conn.transaction():
        # Two dimensions in a column declared with one: no Iceberg list holds it.
        conn.execute("INSERT INTO t VALUES (3, '{{1,2},{3,4}}')")
        conn.execute("INSERT INTO u VALUES (1, 'in the poison transaction')")
        xid = conn.execute("SELECT txid_current()").fetchone()
    assert xid is not None
    mirror.sql("INSERT INTO u VALUES (2, 'after it')")
    with pytest.raises(ConversionError) as info:
        mirror.run()
    err = info.value
    text = str(err)
    commit_lsn = Lsn(err.context["lsn"])
    assert err.context["xid"] == int(xid[0])
    assert f"xid {xid[0]}" in text and f"lsn {commit_lsn}" in text and "public.t" in text
    assert f"sparkapply skip --config <file> --lsn {commit_lsn}" in text

    cfg = mirror.write_config(tmp_path / "skip.toml")
    bad = cli("skip", "--config", str(cfg), "--lsn", "not-an-lsn")
    assert bad.returncode == 2 and "--lsn" in bad.stderr
    done = cli("skip", "--config", str(cfg), "--lsn", "0/1")
    assert done.returncode == 2 and "already acknowledged" in done.stderr
    proc = cli("skip", "--config", str(cfg), "--lsn", str(commit_lsn))
    assert proc.returncode == 0, proc.stderr
    record = mirror.config.work_dir / "skip.json"
    assert json.loads(record.read_text()) == {"lsn": str(commit_lsn)}

    summary = mirror.run()
    assert summary.skipped == 1
    assert not record.exists()  # cleared once acknowledged
    _, rows = mirror.iceberg_rows("public.t")
    assert sorted(rows) == [(1, [1]), (2, [2])]  # the publisher minus the skipped one
    _, urows = mirror.iceberg_rows("public.u")
    assert sorted(urows) == [(2, "after it")]
    # The slot has moved past it: a restart does not see it again.
    mirror.sql("INSERT INTO u VALUES (3, 'later')")
    assert mirror.run().skipped == 0
    _, urows = mirror.iceberg_rows("public.u")
    assert sorted(urows) == [(2, "after it"), (3, "later")]


def test_login_without_replication_stops_with_exit_2(pg_dsn: str, tmp_path: Path) -> None:
    role = f"norepl_{os.getpid()}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    try:
        dsn = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'work_dir = "{tmp_path}/w"\n[source]\ndsn = "{dsn}"\npublication = "pub"\n'
            f'[sink.catalog]\ntype = "sql"\nuri = "sqlite:///{tmp_path}/c.db"\n'
        )
        started = time.monotonic()
        proc = cli("run", "--config", str(cfg))
        assert proc.returncode == 2, proc.stderr
        assert f'ALTER ROLE "{role}" WITH REPLICATION' in proc.stderr
        assert "lacks the REPLICATION attribute" in proc.stderr
        assert time.monotonic() - started < 60  # stopped, not retried
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_malformed_dsn_is_a_configuration_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[source]\ndsn = "x"\npublication = "p"\n')
    proc = cli("run", "--config", str(cfg))
    assert proc.returncode == 2, proc.stderr
    assert "[source] dsn is not a libpq connection string" in proc.stderr
    assert "ProgrammingError" not in proc.stderr


def test_a_dropped_connection_is_retried(mirror: Mirror) -> None:
    mirror.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION pub FOR TABLE t")
    mirror.run()
    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    try:
        _wait(lambda: _slot_pid(mirror) is not None, "the subscriber to stream")
        with psycopg.connect(mirror.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (_slot_pid(mirror),))
        mirror.sql("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 100) g")
        running.wait_flushed(mirror.insert_lsn())
        assert running.sub.summary.reconnects >= 1
    finally:
        running.stop()
    mirror.assert_mirrored("public.t")


def test_spark_job_failures_and_commit_conflicts_are_transient(spark: Any) -> None:
    def crash(_: object) -> object:
        os._exit(3)  # the Python worker dies, as when an executor is lost

    with pytest.raises(Exception) as info:
        spark.sparkContext.parallelize([1], 1).map(crash).collect()
    lost = spark_job_error(info.value)
    assert lost is not None and lost.kind is ErrorKind.TRANSIENT
    assert "Spark job failed" in str(lost)
    assert spark_job_error(ValueError("a bug of ours")) is None
    assert CommitConflictError.kind is ErrorKind.TRANSIENT
    assert CommitOutcomeUnknownError.kind is ErrorKind.TRANSIENT
