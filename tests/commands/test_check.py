"""``sparkapply check`` on real servers: each misconfiguration found on its own, with its
fix, and a good setup passing whole."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from sparkapply.commands.check import render_text, run_checks
from sparkapply.config import Config
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.progress import LSN_TABLE_PROPERTY
from sparkapply.source.preflight import Finding
from tests.mirror import cli, make_config
from tests.servers import own_server

pytestmark = pytest.mark.integration


def _by_name(found: list[Finding]) -> dict[str, Finding]:
    return {f.name: f for f in found}


def _failed(found: list[Finding]) -> list[str]:
    return [f.name for f in found if f.failed]


def _publish(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def test_a_good_setup_passes_every_check(pg_dsn: str, tmp_path: Path, spark: object) -> None:
    _publish(
        pg_dsn,
        "CREATE TABLE orders (id int PRIMARY KEY, amount numeric)",
        "CREATE TABLE events (kind text)",
        "CREATE PUBLICATION pub FOR TABLE orders",
        # A keyless table is fine where only inserts are published.
        "CREATE PUBLICATION ins FOR TABLE events WITH (publish = 'insert, truncate')",
    )
    config = make_config(pg_dsn, tmp_path / "work")
    found = run_checks(replace(config, source=replace(config.source, publication=("pub", "ins"))))
    assert _failed(found) == [], render_text(found)
    seen = _by_name(found)
    assert "public.events" in seen["published tables"].detail
    assert "public.orders" in seen["published tables"].detail
    assert seen["warehouse"].outcome == "pass", seen["warehouse"]
    assert seen["capacity"].outcome == "pass"
    assert render_text(found).splitlines()[-1].startswith("check: OK")
    # Nothing stays behind: no slot was made, no probe file is left.
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
    assert not [p for p in (tmp_path / "work").rglob("*check*")]


def test_each_publisher_fault_is_found_with_its_fix(
    pg_dsn: str, tmp_path: Path, spark: object
) -> None:
    _publish(
        pg_dsn,
        "CREATE TABLE orders (id int PRIMARY KEY)",
        "CREATE TABLE audit (line text)",
        "CREATE PUBLICATION pub FOR TABLE orders, audit",
    )
    work = tmp_path / "work"

    keyless = run_checks(make_config(pg_dsn, work))
    assert _failed(keyless) == ["replica identity"], render_text(keyless)
    finding = _by_name(keyless)["replica identity"]
    assert "public.audit" in finding.detail and "REPLICA IDENTITY FULL" in (finding.fix or "")

    missing = run_checks(make_config(pg_dsn, work, publication="nopub"))
    assert _failed(missing) == ["publication"], render_text(missing)
    assert "'nopub'" in _by_name(missing)["publication"].detail

    role = f"norepl_{os.getpid()}"
    _publish(pg_dsn, f"CREATE ROLE {role} LOGIN", f"GRANT SELECT ON orders TO {role}")
    try:
        dsn = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
        no_role = run_checks(make_config(dsn, work, publication="pub"))
        expected = {"replication role", "select privilege", "replica identity"}
        assert set(_failed(no_role)) == expected, render_text(no_role)
        assert f'ALTER ROLE "{role}" WITH REPLICATION' in (
            _by_name(no_role)["replication role"].fix or ""
        )
        assert "public.audit" in _by_name(no_role)["select privilege"].detail
    finally:
        _publish(pg_dsn, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


@pytest.fixture()
def replica_level_server() -> Iterator[EmbeddedPostgres]:
    """A server of the test's own, with wal_level=replica and room for two slots."""
    settings = {"wal_level": "replica", "max_replication_slots": "2", "max_wal_senders": "2"}
    with own_server("check", settings) as pg:
        yield pg


def test_wal_level_and_slot_capacity(
    replica_level_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = replica_level_server.dsn()
    _publish(
        dsn,
        "CREATE TABLE t (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE t",
        # One slot of two taken: the mirror's slot and verify's temporary one need both.
        "SELECT pg_create_physical_replication_slot('standby')",
    )
    config = make_config(dsn, tmp_path / "work")
    from sparkapply.source.preflight import publisher_findings

    found = publisher_findings(config.source)
    assert _failed(found) == ["wal_level", "capacity"], render_text(found)
    seen = _by_name(found)
    assert "has wal_level=replica" in seen["wal_level"].detail
    assert "ALTER SYSTEM SET wal_level = logical" in (seen["wal_level"].fix or "")
    assert "1 of 2 replication slots free (needs 2)" in seen["capacity"].detail


def test_an_unreachable_catalog_exits_2_with_json(pg_dsn: str, tmp_path: Path) -> None:
    _publish(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE t")
    cfg = tmp_path / "check.toml"
    cfg.write_text(
        f'work_dir = "{tmp_path / "work"}"\n'
        f'[source]\ndsn = "{pg_dsn}"\npublication = "pub"\n'
        '[sink.catalog]\ntype = "sql"\n'
        'uri = "postgresql+psycopg://nobody:hunter2@127.0.0.1:1/nothing"\n'
        f'warehouse = "file://{tmp_path / "wh"}"\n'
    )
    proc = cli("check", "--config", str(cfg), "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    failed = [c for c in report["checks"] if c["outcome"] == "fail"]
    assert [c["name"] for c in failed] == ["catalog"], report
    assert "hunter2" not in proc.stdout + proc.stderr  # the password is never shown


def test_a_warehouse_the_executors_cannot_write(pg_dsn: str, tmp_path: Path, spark: object) -> None:
    _publish(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE t")
    config: Config = make_config(pg_dsn, tmp_path / "work")
    catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    catalog.create_namespace("public")
    # The table's data files go under a plain file: no task can write there.
    broken = tmp_path / "not-a-folder"
    broken.write_text("a file")
    catalog.create_table(
        ("public", "t"),
        Schema(NestedField(1, "id", LongType(), required=False)),
        properties={LSN_TABLE_PROPERTY: "0/0", "write.data.path": f"file://{broken}/data"},
    )
    found = run_checks(config)
    assert _failed(found) == ["warehouse"], render_text(found)
    finding = _by_name(found)["warehouse"]
    assert f"{broken}/data" in finding.detail and "Spark task cannot write" in finding.detail
