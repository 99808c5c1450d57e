"""Prometheus metrics of one subscriber, served over HTTP when ``[metrics] port`` is set.

Every metric lives in the subscriber's own registry (not prometheus_client's global
one), so two subscribers in one process (tests, the demo) do not collide. Counters
and histograms are updated by the receiving thread when a batch completes; spool
bytes and pending prepared transactions are read from ``work_dir`` at scrape time.
LSNs are exported as numbers (bytes of WAL), so lag is a plain subtraction.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from sparkapply import __version__
from sparkapply.changes.prepared import pending_prepared
from sparkapply.config import MetricsConfig, SourceConfig
from sparkapply.errors import ConfigError
from sparkapply.pgoutput.frames import PG_EPOCH_OFFSET_MICROS
from sparkapply.state.layout import spool_bytes
from sparkapply.state.verdict import last_verify

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from sparkapply.changes.transaction import CommittedTxn
    from sparkapply.run.batch import BatchStats

log = logging.getLogger(__name__)

# Seconds: a batch takes from milliseconds (a few rows) to minutes (a bulk load).
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
COMMIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class SlotLag:
    """The slot's lag and retained WAL as the publisher sees them, asked at most every
    :data:`SLOT_TTL` seconds however often Prometheus scrapes. Unlike
    ``sparkapply_lag_bytes`` it counts WAL not yet received, so it grows while the
    stream is stalled or the run is down (read it from the last scrape, or ``status``)."""

    def __init__(self, source: SourceConfig) -> None:
        self.source = source
        self._at = 0.0
        self._values = (math.nan, math.nan)
        self._lock = threading.Lock()

    def values(self) -> tuple[float, float]:
        with self._lock:
            if time.monotonic() - self._at >= SLOT_TTL:
                self._values = self._ask()
                self._at = time.monotonic()
            return self._values

    def _ask(self) -> tuple[float, float]:
        from sparkapply.source.connection import connect

        try:
            with connect(
                self.source.dsn, application_name="sparkapply-metrics", connect_timeout=5
            ) as conn:
                row = conn.execute(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), "
                    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) "
                    "FROM pg_replication_slots WHERE slot_name = %s",
                    (self.source.slot,),
                ).fetchone()
        except Exception:  # a scrape must answer; the publisher may be away
            return (math.nan, math.nan)
        if row is None or row[0] is None:
            return (math.nan, math.nan)
        return (float(row[0]), float(row[1] if row[1] is not None else math.nan))


SLOT_TTL = 5.0


class Metrics:
    def __init__(
        self, config: MetricsConfig, work_dir: Path, source: SourceConfig | None = None
    ) -> None:
        self.config = config
        self.registry = r = CollectorRegistry()
        gauge, counter = partial(Gauge, registry=r), partial(Counter, registry=r)
        self.received_lsn = gauge(
            "sparkapply_received_lsn", "Highest WAL position received (bytes)"
        )
        self.flushed_lsn = gauge(
            "sparkapply_flushed_lsn",
            "WAL position acknowledged to the publisher as durable (bytes)",
        )
        self.lag_bytes = gauge("sparkapply_lag_bytes", "Received minus acknowledged WAL position")
        self.lag_seconds = gauge(
            "sparkapply_lag_seconds",
            "Now minus the commit time of the last applied source transaction (0 when idle)",
        )
        self.rows_applied = counter(
            "sparkapply_rows_applied",
            "Source row changes applied, by table and operation",
            ["table", "operation"],
        )
        self.rows_written = counter(
            "sparkapply_rows_written", "Row versions written to Iceberg", ["table"]
        )
        self.rows_removed = counter(
            "sparkapply_rows_removed", "Rows removed from Iceberg", ["table"]
        )
        self.transactions = counter(
            "sparkapply_transactions_applied", "Source transactions applied"
        )
        self.skipped = counter(
            "sparkapply_transactions_skipped", "Transactions dropped by `sparkapply skip`"
        )
        self.batch_seconds = Histogram(
            "sparkapply_batch_seconds",
            "Wall time of one batch's apply (copy of new tables, Spark job, commits)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "sparkapply_iceberg_commit_seconds",
            "Wall time of one batch's Iceberg commits (all its tables)",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.reconnects = counter(
            "sparkapply_reconnects", "Replication sessions ended by a transient error"
        )
        self.slot_missing = counter(
            "sparkapply_slot_missing",
            "Sessions that found the slot missing while the mirror held copied tables "
            "(every table is copied again): a failover without a synced slot, or a dropped slot",
        )
        self._retrying = gauge(
            "sparkapply_retrying",
            "1 while the run retries after a transient error (reconnecting), else 0",
        )
        self._retrying_since = gauge(
            "sparkapply_retrying_since_timestamp_seconds",
            "When the current run of retries began (epoch seconds); 0 when not retrying",
        )
        self.last_batch = gauge(
            "sparkapply_last_batch_timestamp_seconds",
            "When the last batch was acknowledged (epoch seconds)",
        )
        self.table_lsn = gauge(
            "sparkapply_table_applied_lsn",
            "WAL position each table is applied up to (bytes), as of its last commit",
            ["table"],
        )
        gauge("sparkapply_up", "1 while sparkapply runs").set(1)
        gauge("sparkapply_build_info", "sparkapply's version", ["version"]).labels(__version__).set(
            1
        )
        if source is not None:
            slot = SlotLag(source)
            gauge(
                "sparkapply_slot_lag_bytes",
                "The publisher's WAL position minus the slot's confirmed one (NaN: unknown)",
            ).set_function(lambda: slot.values()[0])
            gauge(
                "sparkapply_slot_retained_wal_bytes",
                "WAL the slot makes the publisher keep (from its restart_lsn; NaN: unknown)",
            ).set_function(lambda: slot.values()[1])
        spool = gauge("sparkapply_spool_bytes", "Bytes in the spool under work_dir")
        spool.set_function(lambda: float(spool_bytes(work_dir)))
        prepared = gauge(
            "sparkapply_prepared_pending",
            "Prepared transactions staged, waiting for COMMIT/ROLLBACK PREPARED",
        )
        prepared.set_function(lambda: float(len(pending_prepared(work_dir))))
        verified = gauge(
            "sparkapply_verify_match",
            "The last `sparkapply verify`: 1 every table matched, 0 one differed, -1 none yet",
        )
        verified.set_function(lambda: _verify_gauge(work_dir))
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- serving ------------------------------------------------------------------------

    def serve(self) -> int | None:
        """Start the endpoint if configured; returns the bound port."""
        if self.config.port is None:
            return None
        try:
            server, thread = start_http_server(
                self.config.port, addr=self.config.host, registry=self.registry
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {self.config.host}:{self.config.port}: {exc}",
                key="metrics.port",
                hint="choose a free port (another sparkapply may use this one), or leave "
                "[metrics] port out",
            ) from exc
        self._server, self._thread = server, thread
        port = int(server.server_port)
        log.info("metrics at http://%s:%d/metrics", self.config.host, port)
        return port

    @property
    def port(self) -> int | None:
        return None if self._server is None else int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    # -- updates ------------------------------------------------------------------------

    def positions(self, received: int, flushed: int, *, idle: bool) -> None:
        self.received_lsn.set(received)
        self.flushed_lsn.set(flushed)
        self.lag_bytes.set(max(0, received - flushed))
        if idle:
            self.lag_seconds.set(0)

    def retrying(self, since: float | None) -> None:
        """Retrying since ``since`` (epoch seconds), or streaming again (None)."""
        if since is not None:
            self.reconnects.inc()
        self._retrying.set(0 if since is None else 1)
        self._retrying_since.set(since or 0)

    def batch_done(self, txns: list[CommittedTxn], stats: BatchStats, seconds: float) -> None:
        self.last_batch.set(time.time())
        self.batch_seconds.observe(seconds)
        self.commit_seconds.observe(stats.commit_seconds)
        self.transactions.inc(len(txns))
        for res in stats.results:
            for op, n in (
                ("insert", res.n_inserts),
                ("update", res.n_updates),
                ("delete", res.n_deletes),
            ):
                if n:
                    self.rows_applied.labels(res.table, op).inc(n)
            self.rows_written.labels(res.table).inc(res.rows_written)
            if res.last_commit_lsn:
                self.table_lsn.labels(res.table).set(res.last_commit_lsn)
            self.rows_removed.labels(res.table).inc(res.rows_removed)
        if txns:
            committed = (txns[-1].commit_time + PG_EPOCH_OFFSET_MICROS) / 1e6
            self.lag_seconds.set(max(0.0, time.time() - committed))


def _verify_gauge(work_dir: Path) -> float:
    verdict = last_verify(work_dir)
    if verdict is None:
        return -1.0
    return 1.0 if verdict.get("match") else 0.0
