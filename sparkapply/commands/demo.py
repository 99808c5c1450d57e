"""``sparkapply demo``: a bundled PostgreSQL, a live workload, mirrored into Iceberg.

One table is filled before sparkapply starts (about a million rows: the parallel
initial copy, with its progress bars), then a live workload runs while it streams: a
bulk load large enough to be streamed in chunks, updates, deletes and a prepared
transaction committed later. At the end ``sparkapply verify`` compares every table by
content at one exact LSN, with the mirror still running, and the demo ends with a
one-line verdict (exit code 0 when every table matches).

Everything lives under a ``work_dir`` of the demo's own (``.sparkapply-demo`` unless
the config or ``--work-dir`` says otherwise): the PostgreSQL data directory, the spool,
the SQLite catalog, the warehouse and Spark's log. Run it twice and it starts afresh,
but it only ever removes a folder it made itself (marked by a ``DEMO`` file in it): a
``work_dir`` that holds anything else, such as a user's own mirror made from a copy of
``configs/local.toml``, is refused with exit code 2 and left as it is.

The demo's own SQL (the schema, the workload, the waits for the mirror) plays the
application on the bundled server, so it connects with psycopg as any client would;
sparkapply's own sessions on the publisher go through ``source.connection.connect``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from sparkapply.config import Config, load_config
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.errors import ConfigError
from sparkapply.lsn import Lsn
from sparkapply.state import layout

if TYPE_CHECKING:
    from sparkapply.verify.command import VerifyReport

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "work_dir": ".sparkapply-demo",
    # The DSN is the bundled server's, set once it runs.
    "source": {"dsn": "host=127.0.0.1", "publication": "sparkapply_pub"},
    "sink": {
        "catalog": {
            "type": "sql",
            "uri": "sqlite:///{work_dir}/catalog.db",
            "warehouse": "file://{work_dir}/warehouse",
        }
    },
    "spark": {
        "master": "local[2]",
        "conf": {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.memory": "2g",
        },
    },
    # A free port, logged: a fixed one may be taken on the machine.
    "metrics": {"port": 0},
}
"""The demo's embedded defaults, under a ``--config`` file's keys and the environment."""

SCHEMA = """
CREATE SCHEMA shop;
CREATE TABLE shop.customers (id int PRIMARY KEY, name text NOT NULL, email text, notes text);
CREATE TABLE shop.orders (
    id bigint PRIMARY KEY, customer_id int NOT NULL, amount numeric(12,2),
    status text, created_at timestamptz, payload jsonb);
CREATE TABLE shop.events (kind text, detail text);
ALTER TABLE shop.events REPLICA IDENTITY FULL;
CREATE PUBLICATION {pub} FOR TABLES IN SCHEMA shop;
"""

TABLES = ("shop.customers", "shop.orders", "shop.events")


_ORDERS = (
    "INSERT INTO shop.orders SELECT g, 1 + g %% 1000, (g %% 10000) / 100.0, 'new', "
    "timestamptz '2026-01-01' + g * interval '1 minute', "
    "jsonb_build_object('n', g) FROM generate_series(%s::bigint, %s::bigint) g"
)


def _prefill(dsn: str, rows: int) -> None:
    """Rows that exist before the slot does: sparkapply copies them first."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO shop.customers SELECT g, 'customer ' || g, 'c' || g || '@example.com', "
            "NULL FROM generate_series(1, 1000) g"
        )
        conn.execute(_ORDERS, (1, rows))
        conn.execute("VACUUM ANALYZE shop.orders")  # a row estimate for the progress bar


def _workload(dsn: str, first: int, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A bulk load in one transaction: streamed to the subscriber in chunks.
        conn.execute(_ORDERS, (first, first + rows - 1))
        # A prepared transaction, committed after other work.
        conn.execute("BEGIN")
        conn.execute("UPDATE shop.customers SET notes = 'vip' WHERE id <= 10")
        conn.execute("INSERT INTO shop.events VALUES ('vip', 'first ten customers')")
        conn.execute("PREPARE TRANSACTION 'demo-vip'")
        # Small transactions touching copied and streamed rows alike.
        for i in range(20):
            conn.execute("UPDATE shop.orders SET status = 'paid' WHERE id %% 997 = %s", (i,))
        conn.execute("DELETE FROM shop.orders WHERE id % 701 = 0")
        conn.execute("INSERT INTO shop.events VALUES ('cleanup', 'deleted every 701st order')")
        conn.execute("COMMIT PREPARED 'demo-vip'")
        conn.execute("DELETE FROM shop.customers WHERE id > 990")


def _wait_streaming(dsn: str, slot: str, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 300
    while thread.is_alive() and time.monotonic() < deadline:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT active_pid IS NOT NULL FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            ).fetchone()
        if row and row[0]:
            return
        time.sleep(0.2)


def demo_config(config_path: str | None, work_dir: str | None = None, **overrides: Any) -> Config:
    """The demo's config: its defaults, the file's keys, the environment, ``work_dir``."""
    extra: dict[str, Any] = dict(overrides)
    if work_dir is not None:
        extra["work_dir"] = work_dir
    return load_config(config_path, defaults=DEFAULTS, overrides=extra or None)


def prepare_work_dir(work: Path) -> None:
    """An empty ``work`` marked as the demo's. Only a folder the demo made (or an
    empty one) is emptied: anything else may be a mirror's spool, prepared
    transactions and catalog, which the demo must never delete."""
    marker = layout.demo_marker(work)
    if work.exists():
        if not work.is_dir():
            raise ConfigError(f"the demo's work_dir {work} is a file", key="work_dir")
        if marker.exists():
            shutil.rmtree(work)
        elif any(work.iterdir()):
            held = ", ".join(sorted(p.name for p in work.iterdir())[:5])
            raise ConfigError(
                f"the demo's work_dir {work} holds files the demo did not make ({held}); "
                "the demo starts afresh each time and would delete them",
                key="work_dir",
                hint="give the demo a folder of its own: sparkapply demo --work-dir "
                "<new folder> (by default it uses .sparkapply-demo)",
            )
    work.mkdir(parents=True, exist_ok=True)
    marker.write_text(
        "Made by `sparkapply demo`: the next demo removes this folder and makes it again.\n"
    )


def run_demo(config: Config, *, rows: int = 1_000_000, verbose: bool = False) -> int:
    from sparkapply.apply.session import configure_spark_logging
    from sparkapply.run.subscriber import Subscriber
    from sparkapply.verify.command import run_verify

    base = config
    work = base.work_dir
    prepare_work_dir(work)
    configure_spark_logging(work, verbose=verbose)
    pg = EmbeddedPostgres(
        work / "postgres",
        settings={"logical_decoding_work_mem": "64kB"},
    )
    pg.start()
    try:
        dsn = pg.dsn()
        pub = base.source.publication[0]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA.format(pub=psycopg.sql.Identifier(pub).as_string(conn)))
        log.info("filling shop.orders with %s rows (copied when sparkapply starts)", f"{rows:,}")
        _prefill(dsn, rows)
        config = replace(base, source=replace(base.source, dsn=dsn))
        sub = Subscriber(config)
        errors: list[BaseException] = []

        def replicate() -> None:
            try:
                sub.run()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=replicate, name="sparkapply-demo", daemon=True)
        thread.start()
        try:
            # Start the workload once the subscriber streams (its slot exists and the
            # initial copy of the empty tables is done), so the bulk load is streamed.
            _wait_streaming(dsn, config.source.slot, thread)
            bulk = max(rows // 10, 1000)
            log.info(
                "running the workload (a %s-row bulk load, updates, deletes, 2PC)", f"{bulk:,}"
            )
            _workload(dsn, rows + 1, bulk)
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            target = Lsn.parse(row[0]) if row else Lsn(0)
            while thread.is_alive() and sub.summary.flushed < target:
                time.sleep(0.5)
            if errors:
                raise errors[0]
            # The final check is `sparkapply verify`, with the mirror still running.
            report = run_verify(config, catalog=sub.catalog, timeout=120)
        finally:
            sub.stop()
            thread.join()
        if errors:
            raise errors[0]
        return _verdict(config, report)
    finally:
        pg.stop()


def _verdict(config: Config, report: VerifyReport) -> int:
    """Print the verify report, where the mirror is and how to read it; the exit code."""
    print()
    print(report.render())
    props = config.catalog_properties()
    print()
    print(f"warehouse: {props.get('warehouse')}")
    print(f"catalog:   {props.get('uri')} (pyiceberg SQL catalog '{config.sink.catalog_name}')")
    print(
        'read it:   python -c "from pyiceberg.catalog import load_catalog; '
        f"c = load_catalog('{config.sink.catalog_name}', type='sql', "
        f"uri='{props.get('uri')}', warehouse='{props.get('warehouse')}'); "
        "print(c.load_table('shop.orders').scan().to_arrow().num_rows)\""
    )
    print()
    if not report.match:
        bad = ", ".join(t.table for t in report.tables if not t.match)
        print(f"MISMATCH: {bad} differ between PostgreSQL and Iceberg")
        return 1
    print(
        f"OK: all {len(report.tables)} tables identical in PostgreSQL and Iceberg at "
        f"{report.lsn} (sparkapply verify: row counts and content hashes)"
    )
    return 0
