"""What a health check sees: ``status`` and ``status --health`` while a run streams,
retries and after it stopped, and the metrics that say the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import generate_latest

from sparkapply import __version__
from sparkapply.run.subscriber import Subscriber
from sparkapply.state.batch_log import read_batch_log
from sparkapply.state.run_state import read_run_state
from tests.mirror import Mirror, Running, cli, wait_until

pytestmark = pytest.mark.integration


def _metric(sub: Subscriber, name: str) -> float:
    value = sub.metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def _allow_connections(dsn: str, allow: bool) -> None:
    db = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True, dbname="postgres") as conn:
        conn.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS {str(allow).lower()}')
        if not allow:  # the walsender of the running session goes too
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND backend_type = 'walsender'",
                (db,),
            )


def test_status_and_metrics_follow_the_run(mirror: Mirror, tmp_path: Path, spark: Any) -> None:
    mirror.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION pub FOR TABLE t")
    cfg = mirror.write_config(tmp_path / "c.toml")
    never = cli("status", "--config", str(cfg), "--health")
    assert never.returncode == 3, never.stderr
    assert "no run has used this work_dir" in never.stderr

    run = Running(Subscriber(mirror.config, spark=spark))
    try:
        wait_until(lambda: run.sub.summary.streaming_started > 0, "streaming to start")
        mirror.sql("INSERT INTO t VALUES (1, 'a')")
        run.wait_flushed(mirror.insert_lsn())
        healthy = cli("status", "--config", str(cfg), "--health")
        assert healthy.returncode == 0, healthy.stderr
        assert "run        streaming since" in healthy.stdout
        sub = run.sub
        assert _metric(sub, "sparkapply_up") == 1
        assert (
            sub.metrics.registry.get_sample_value("sparkapply_build_info", {"version": __version__})
            == 1
        )
        assert _metric(sub, "sparkapply_retrying") == 0
        assert _metric(sub, "sparkapply_last_batch_timestamp_seconds") > 0
        assert _metric(sub, "sparkapply_slot_lag_bytes") >= 0
        assert _metric(sub, "sparkapply_slot_retained_wal_bytes") > 0
        assert b"sparkapply_table_applied_lsn{" in generate_latest(sub.metrics.registry)

        # The publisher refuses the session: the run retries, and says so.
        _allow_connections(mirror.dsn, False)
        try:
            wait_until(lambda: sub.state.state == "retrying", "the run to retry", 60)
            wait_until(lambda: sub.state.attempts >= 2, "a second attempt", 60)
            state = read_run_state(mirror.config.work_dir)
            assert state is not None and state.state == "retrying" and state.alive()
            assert state.error is not None and "ConnectionLostError" in state.error
            assert _metric(sub, "sparkapply_retrying") == 1
            assert _metric(sub, "sparkapply_retrying_since_timestamp_seconds") == state.since
        finally:
            _allow_connections(mirror.dsn, True)
        wait_until(lambda: sub.state.state == "streaming", "streaming again", 90)
        assert _metric(sub, "sparkapply_retrying") == 0
        mirror.sql("INSERT INTO t VALUES (2, 'b')")
        run.wait_flushed(mirror.insert_lsn())
    finally:
        run.stop()
    stopped = cli("status", "--config", str(cfg), "--health", "--json")
    assert stopped.returncode == 3, stopped.stderr
    assert "the run is stopped" in stopped.stderr
    assert '"state": "stopped"' in stopped.stdout
    mirror.catalog = run.sub.catalog
    mirror.assert_mirrored("public.t")
    # Every acknowledged batch is in the run's record, the last at what was flushed.
    records = read_batch_log(mirror.config.work_dir)
    assert len(records) == run.sub.summary.batches >= 2
    assert records[-1]["flushed_lsn"] <= int(run.sub.summary.flushed)
    assert sum(r["transactions"] for r in records) == run.sub.summary.transactions
