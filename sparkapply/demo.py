"""``sparkapply demo``: a bundled PostgreSQL, a live workload, mirrored into Iceberg.

Everything lives under the config's ``work_dir``: the PostgreSQL data directory, the
spool, the SQLite catalog and the warehouse. Run it twice and it starts afresh.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time

import psycopg

from sparkapply.config import load_config
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.lsn import Lsn

log = logging.getLogger(__name__)

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


def _workload(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO shop.customers SELECT g, 'customer ' || g, 'c' || g || '@example.com', "
            "NULL FROM generate_series(1, 1000) g"
        )
        # A bulk load in one transaction: streamed to the subscriber in chunks.
        conn.execute(
            "INSERT INTO shop.orders SELECT g, 1 + g %% 1000, (g %% 10000) / 100.0, 'new', "
            "timestamptz '2026-01-01' + g * interval '1 minute', "
            "jsonb_build_object('n', g) FROM generate_series(1, %s) g",
            (rows,),
        )
        # A prepared transaction, committed after other work.
        conn.execute("BEGIN")
        conn.execute("UPDATE shop.customers SET notes = 'vip' WHERE id <= 10")
        conn.execute("INSERT INTO shop.events VALUES ('vip', 'first ten customers')")
        conn.execute("PREPARE TRANSACTION 'demo-vip'")
        for i in range(20):
            conn.execute("UPDATE shop.orders SET status = 'paid' WHERE id %% 20 = %s", (i,))
        conn.execute("DELETE FROM shop.orders WHERE id % 7 = 0")
        conn.execute("INSERT INTO shop.events VALUES ('cleanup', 'deleted every 7th order')")
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


def _count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        schema, name = table.split(".")
        row = conn.execute(
            psycopg.sql.SQL("SELECT count(*) FROM {}.{}").format(
                psycopg.sql.Identifier(schema), psycopg.sql.Identifier(name)
            )
        ).fetchone()
    return int(row[0]) if row else 0


def run_demo(config_path: str, *, rows: int = 200_000) -> int:
    from sparkapply.sink.read import read_table
    from sparkapply.subscriber import Subscriber

    base = load_config(config_path)
    work = base.work_dir
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
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
        config = load_config(config_path, overrides={"source": {"dsn": dsn}})
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
            log.info("running the workload (%d-row bulk load, updates, deletes, 2PC)", rows)
            _workload(dsn, rows)
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            target = Lsn.parse(row[0]) if row else Lsn(0)
            while thread.is_alive() and sub.summary.flushed < target:
                time.sleep(0.5)
        finally:
            sub.stop()
            thread.join()
        if errors:
            raise errors[0]
        catalog = sub._catalog
        assert catalog is not None
        print()
        print(f"{'table':<20}{'postgres':>12}{'iceberg':>12}")
        ok = True
        for name in TABLES:
            ns, tbl = name.split(".")
            iceberg_rows = read_table(catalog.load_table((ns, tbl))).num_rows
            pg_rows = _count(dsn, name)
            ok &= iceberg_rows == pg_rows
            print(f"{name:<20}{pg_rows:>12}{iceberg_rows:>12}")
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
        return 0 if ok else 1
    finally:
        pg.stop()
