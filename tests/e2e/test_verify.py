"""``sparkapply verify`` against a live mirror: it matches while a workload runs, and
it names the rows when the mirror is broken behind the subscriber's back."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from sparkapply.cli import main
from sparkapply.errors import CutError
from sparkapply.lsn import Lsn
from sparkapply.metrics import _verify_gauge
from sparkapply.run.exact_cut import bring_to_cut, slot_holder
from sparkapply.run.subscriber import Subscriber
from sparkapply.sink.cuts import read_cuts
from sparkapply.sink.progress import applied_lsn
from sparkapply.state.layout import CUT_REQUESTS_DIR
from sparkapply.state.verdict import last_verify
from sparkapply.verify.command import run_verify
from tests.conftest import PgServer
from tests.mirror import Mirror, Running, wait_until

SCHEMA = (
    "CREATE TABLE items (id int PRIMARY KEY, v text, w numeric(10,2), f float8,"
    " at timestamptz, d date, u uuid, b bytea, tags text[], ok bool)",
    "CREATE TABLE events (who text, what int)",  # no key: insert-only, by row image
    "CREATE TABLE full_rows (a int, b text)",
    "ALTER TABLE full_rows REPLICA IDENTITY FULL",
    "CREATE TABLE filtered (id int PRIMARY KEY, a int, secret text)",
)
ROWS = (
    "INSERT INTO items SELECT g, 'v' || g, g / 4.0, g * 0.1, "
    "'2026-11-24 10:00:00+00'::timestamptz + g * interval '1 minute', "
    "'2026-01-01'::date + g, gen_random_uuid(), int4send(g), ARRAY['t' || g, NULL], g % 2 = 0 "
    "FROM generate_series(1, 300) g"
)


def _setup(mirror: Mirror) -> None:
    mirror.sql(
        *SCHEMA,
        ROWS,
        "INSERT INTO items VALUES (1000, NULL, 'NaN', 'NaN', 'infinity', '-infinity', NULL,"
        " NULL, '{}', NULL)",
        "INSERT INTO events SELECT 'w' || (g % 3), g % 5 FROM generate_series(1, 50) g",
        "INSERT INTO full_rows SELECT g, 'x' FROM generate_series(1, 20) g",
        "INSERT INTO filtered SELECT g, g % 10, 'hidden' FROM generate_series(1, 40) g",
        # A column list and a row filter: verify reads what is published, as the copy.
        "CREATE PUBLICATION pub FOR TABLE items, events, full_rows, filtered (id, a) WHERE (a > 5)",
    )


def test_verify_matches_a_live_mirror_while_it_applies(
    mirror: Mirror, pg_server: PgServer, tmp_path: Path
) -> None:
    _setup(mirror)
    mirror.run()
    stop = threading.Event()

    def workload() -> None:
        """Small transactions, streamed ones (every change sent as it happens) and
        two-phase ones, committed at once or later."""
        with psycopg.connect(mirror.dsn, autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                with conn.transaction():
                    conn.execute(
                        "UPDATE items SET v = v || '+', w = w + 1 WHERE id = %s", (n % 300 + 1,)
                    )
                    conn.execute("INSERT INTO events VALUES ('live', %s)", (n,))
                    conn.execute("DELETE FROM full_rows WHERE a = %s", (n % 20 + 1,))
                    conn.execute("INSERT INTO full_rows VALUES (%s, 'y')", (n % 20 + 1,))
                    conn.execute("INSERT INTO filtered VALUES (%s, %s, 's')", (1000 + n, n % 10))
                if n % 10 == 0:
                    conn.execute(
                        "INSERT INTO events SELECT 'bulk', g FROM generate_series(1, 500) g"
                    )
                time.sleep(0.02)  # a steady load the mirror keeps up with
                if n % 7 == 0:
                    conn.execute("BEGIN")
                    conn.execute("UPDATE items SET ok = NOT ok WHERE id = %s", (n % 300 + 1,))
                    conn.execute(f"PREPARE TRANSACTION 'g{n}'")
                    conn.execute(f"COMMIT PREPARED 'g{n}'")

    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    thread = threading.Thread(target=workload, daemon=True)
    thread.start()
    pg_server.set_streaming("immediate")
    try:
        for _ in range(5):
            report = run_verify(mirror.config, spark=mirror.spark, timeout=120)
            assert report.match, report.render()
            # Compared with the cut holding every commit below the slot's point, not
            # at it: a commit record can start at the point (a prepared transaction
            # committed as the slot became consistent), and the snapshot does not see it.
            cuts = read_cuts(
                mirror.iceberg_table(mirror.config.sink.cuts_table), at_most=report.lsn
            )
            assert [c.requested for c in cuts if c.lsn == report.lsn - 1] == [True]
            assert {t.table for t in report.tables} == {
                "public.items",
                "public.events",
                "public.full_rows",
                "public.filtered",
            }
            filtered = next(t for t in report.tables if t.table == "public.filtered")
            assert filtered.publisher_rows >= 16  # a > 5 only
            items = next(t for t in report.tables if t.table == "public.items")
            assert items.publisher_rows == items.iceberg_rows == 301
            assert _verify_gauge(mirror.config.work_dir) == 1.0  # what /metrics shows
    finally:
        stop.set()
        thread.join(30)
        pg_server.set_streaming("buffered")
        running.stop()
    # Killed while it brings the stopped mirror to its point: its temporary slot is
    # gone all the same.
    config = mirror.write_config(tmp_path / "verify.toml")
    requests = mirror.config.work_dir / CUT_REQUESTS_DIR
    before = len(list(requests.iterdir())) if requests.exists() else 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkapply", "verify", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: len(list(requests.iterdir())) > before, "verify to ask for its cut", 120)
    proc.kill()
    proc.wait(30)
    with psycopg.connect(mirror.dsn, autocommit=True) as conn:
        slots = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE '%verify%'"
        ).fetchall()
    assert slots == []


def test_verify_names_the_rows_of_a_broken_mirror(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _setup(mirror)
    mirror.run()
    items = mirror.iceberg_table("public.items")
    arrow = items.scan(row_filter="id = 6").to_arrow()
    items.delete("id = 5")  # a row lost
    items.overwrite(  # a value changed
        arrow.set_column(1, "v", pa.array(["changed"], arrow.schema.field("v").type)),
        overwrite_filter="id = 6",
    )
    items.append(items.scan(row_filter="id = 7").to_arrow())  # a row twice
    eight = items.scan(row_filter="id = 8").to_arrow()
    items.overwrite(  # a value dropped to null
        eight.set_column(2, "w", pa.nulls(1, eight.schema.field("w").type)),
        overwrite_filter="id = 8",
    )
    events = mirror.iceberg_table("public.events")
    events.append(events.scan(limit=1).to_arrow())  # a row image twice

    config = mirror.write_config(tmp_path / "verify.toml")
    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    try:
        capsys.readouterr()
        assert main(["verify", "--config", str(config), "--json", "--max-rows", "3"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert main(["verify", "--config", str(config), "--table", "public.full_rows"]) == 0
        text = capsys.readouterr().out
    finally:
        running.stop()
    assert not report["match"]
    by_table = {t["table"]: t for t in report["tables"]}
    assert by_table["public.full_rows"]["match"] and by_table["public.filtered"]["match"]
    found = {
        (d["kind"], d["row"], tuple(d["columns"])) for d in by_table["public.items"]["differences"]
    }
    # Listed in key order, up to --max-rows; counted in full.
    assert found == {
        ("missing in Iceberg", "id='5'", ()),
        ("different", "id='6'", ("v",)),
        ("extra in Iceberg", "id='7'", ()),
    }
    assert by_table["public.items"]["differing"] == 4  # and id 8: w dropped to null
    verdict = last_verify(mirror.config.work_dir)  # the last run: --table full_rows
    assert verdict is not None and verdict["match"] and verdict["lsn"]
    (dup,) = by_table["public.events"]["differences"]
    assert dup["kind"] == "extra in Iceberg" and dup["row"].startswith("(who=")
    assert "MATCH: 1 tables" in text


def _wal_position(conn: psycopg.Connection[tuple[object, ...]]) -> Lsn:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return Lsn(str(row[0]))


def _updates(mirror: Mirror, count: int) -> Lsn:
    """``count`` one-row transactions; the WAL position before the last one's commit."""
    with psycopg.connect(mirror.dsn, autocommit=True) as conn:
        last = _wal_position(conn)
        for i in range(count):
            if i == count - 1:
                last = _wal_position(conn)
            conn.execute("UPDATE acc SET n = n + 1 WHERE id = %s", (i % 50 + 1,))
    return last


def test_verify_brings_a_stopped_mirror_to_its_point(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no run, verify applies up to its point itself (and nothing beyond), then
    compares; it finds a row changed behind the mirror's back."""
    mirror.sql(
        "CREATE TABLE acc (id int PRIMARY KEY, n int, at timestamp)",
        "INSERT INTO acc SELECT g, 0, CASE WHEN g % 3 > 0 THEN timestamp '2026-01-01' "
        "+ g * interval '1 h' END FROM generate_series(1, 50) g",
        "CREATE PUBLICATION pub FOR TABLE acc",
    )
    mirror.run()
    last = _updates(mirror, 300)
    before = applied_lsn(mirror.iceberg_table("public.acc"))
    assert before is not None and before < last  # behind
    config = mirror.write_config(tmp_path / "verify.toml")
    capsys.readouterr()
    started = time.monotonic()
    assert main(["verify", "--config", str(config), "--json"]) == 0
    assert time.monotonic() - started < 60
    report = json.loads(capsys.readouterr().out)
    point = Lsn(report["lsn"])
    table = mirror.iceberg_table("public.acc")
    applied = applied_lsn(table)
    assert applied is not None and last <= applied < point  # at the point, not past it
    cut = read_cuts(mirror.iceberg_table(mirror.config.sink.cuts_table), at_most=point)[-1]
    assert cut.lsn == point - 1 and cut.requested
    assert cut.tables["public.acc"] == table.metadata.current_snapshot_id
    mirror.assert_mirrored("public.acc")
    assert not list((mirror.config.work_dir / CUT_REQUESTS_DIR).iterdir())
    with psycopg.connect(mirror.dsn) as conn:  # its subscriber let go of the slot
        row = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (mirror.slot,)
        ).fetchone()
    assert row == (False,)

    # A value changed behind the mirror's back, and the mirror behind again.
    row = table.scan(row_filter="id = 45").to_arrow()
    table.overwrite(
        row.set_column(1, "n", pa.array([-1], row.schema.field("n").type)),
        overwrite_filter="id = 45",
    )
    _updates(mirror, 20)  # ids 1 to 20: not 45
    assert main(["verify", "--config", str(config), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (acc,) = report["tables"]
    assert [(d["kind"], d["row"], d["columns"]) for d in acc["differences"]] == [
        ("different", "id='45'", ["n"])
    ]


def test_verify_says_when_the_run_it_waits_for_goes_away(mirror: Mirror) -> None:
    """Waiting for a running run's cut, verify notices that the run stopped, and says
    so at once instead of waiting out its timeout."""
    mirror.sql("CREATE TABLE acc (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE acc")
    mirror.run()
    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    wait_until(lambda: slot_holder(mirror.config) is not None, "the run to take its slot")
    far = Lsn(mirror.insert_lsn() + (1 << 32))  # a point the run will not reach
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            bring_to_cut(
                mirror.config, far, timeout=300, spark=mirror.spark, catalog=mirror.catalog
            )
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(2)
    assert not errors  # waiting for the live run
    running.stop()
    stopped = time.monotonic()
    waiter.join(60)
    assert not waiter.is_alive()
    assert time.monotonic() - stopped < 15  # GONE_AFTER, and a read a second
    (error,) = errors
    assert isinstance(error, CutError) and "stopped before making the cut" in str(error)
