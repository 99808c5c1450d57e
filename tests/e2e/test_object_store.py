"""The stack users deploy: an S3 object store behind an Iceberg REST catalog (SeaweedFS).

The config is ``examples/rest-s3.toml`` with only the addresses, names and
credentials changed; the secrets come from the environment in the documented form,
and no ``AWS_*`` variable is set, so nothing reaches the store but what the catalog's
properties say. Tables are compared with the publisher row by row through pyiceberg
(REST) and DuckDB (REST attach, S3 secret); no data or metadata file may land on the
local disk.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sparkapply.cli import main
from sparkapply.commands.check import render_text, run_checks
from sparkapply.config import Config, load_config
from sparkapply.read import latest_cut
from sparkapply.sink.cuts import cuts_identifier, read_cuts
from sparkapply.sink.progress import applied_lsn, lineage_lsn
from sparkapply.sink.read import read_table
from sparkapply.storage import Storage
from tests.conftest import PgServer
from tests.mirror import Mirror, Running, killed, prepare_transaction, slot_for
from tests.readers import _extension
from tests.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parents[2] / "examples" / "rest-s3.toml"
TABLES = ("orders", "accounts")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string is a JSON string


def _dump(doc: Mapping[str, Any], prefix: str = "") -> str:
    """The TOML of ``doc`` (scalars, lists, nested tables): enough for a config."""
    scalars = "".join(
        f"{json.dumps(k)} = {_toml(v)}\n" for k, v in doc.items() if not isinstance(v, dict)
    )
    tables = "".join(
        f"\n[{prefix}{k}]\n" + _dump(v, f"{prefix}{k}.")
        for k, v in doc.items()
        if isinstance(v, dict)
    )
    return scalars + tables


def example_config(
    path: Path,
    weed: SeaweedFS,
    dsn: str,
    namespace: str,
    tables: tuple[str, ...] = TABLES,
    **apply: int,
) -> Path:
    """``examples/rest-s3.toml`` pointed at ``weed`` and the test database; its
    secrets (credential, S3 secret, the placeholders in the file) left to the
    environment."""
    doc = tomllib.loads(EXAMPLE.read_text())
    doc["work_dir"] = str(path.parent / "work")
    doc["source"].update(dsn=dsn, publication=["pub"], slot=slot_for(dsn))
    catalog = doc["sink"]["catalog"]
    catalog.update(
        {
            "uri": weed.catalog_uri,
            "oauth2-server-uri": f"{weed.catalog_uri}/v1/oauth/tokens",
            "warehouse": weed.warehouse,
            "s3.endpoint": weed.s3_endpoint,
            "s3.access-key-id": weed.key_id,
        }
    )
    # The tests share one server: the tables go to a namespace of this test's own.
    doc["sink"]["tables"] = {f"public.{t}": f"{namespace}.{t}" for t in tables}
    doc["sink"]["cuts_table"] = f"{namespace}.cuts"
    doc["spark"]["master"] = "local[2]"
    doc["apply"] = {"batch_linger": 0.1, "driver_fold_bytes": 0, "stage_bytes": 64 * 1024, **apply}
    doc["maintenance"] = {
        "enabled": False,  # run by the command below
        "max_data_files": 2,
        "retain_snapshots": 1,
        "retain_seconds": 0,
        "orphan_grace_seconds": 0,
    }
    path.write_text(_dump(doc))
    return path


@pytest.fixture()
def s3_env(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> SeaweedFS:
    """The process environment a user would have: the secrets in the documented
    variables, no AWS_* variable at all."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SPARKAPPLY_SINK__CATALOG__CREDENTIAL", seaweedfs.credential)
    monkeypatch.setenv("SPARKAPPLY_SINK__CATALOG__S3__SECRET_ACCESS_KEY", seaweedfs.secret)
    return seaweedfs


@pytest.fixture()
def lake(s3_env: SeaweedFS, mirror: Mirror, tmp_path: Path) -> Iterator[tuple[Mirror, Path]]:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    path = example_config(tmp_path / "rest-s3.toml", s3_env, mirror.dsn, namespace)
    mirror.config = load_config(path)
    mirror.slot = mirror.config.source.slot
    yield mirror, path


def _iceberg(config: Config, source: str) -> tuple[str, str]:
    schema, table = source.split(".")
    return config.table_identifier(schema, table)


def _duckdb(weed: SeaweedFS) -> duckdb.DuckDBPyConnection:
    """DuckDB attached to the REST catalog, reading S3 with a secret: the extensions
    from their PyPI wheels, nothing downloaded."""
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    for module, name in (
        (duckdb_extension_httpfs, "httpfs"),
        (duckdb_extension_avro, "avro"),
        (duckdb_extension_iceberg, "iceberg"),
    ):
        con.execute(f"LOAD '{_extension(module, name)}'")
    endpoint = weed.s3_endpoint.removeprefix("http://")
    con.execute(
        "CREATE SECRET s3 (TYPE s3, KEY_ID ?, SECRET ?, ENDPOINT ?, URL_STYLE 'path', "
        "USE_SSL false, REGION 'us-east-1')".replace("?", "'{}'").format(
            weed.key_id, weed.secret, endpoint
        )
    )
    con.execute(
        f"CREATE SECRET rest (TYPE iceberg, CLIENT_ID '{weed.key_id}', "
        f"CLIENT_SECRET '{weed.secret}', "
        f"OAUTH2_SERVER_URI '{weed.catalog_uri}/v1/oauth/tokens')"
    )
    con.execute(
        f"ATTACH '{weed.warehouse}' AS lake "
        f"(TYPE iceberg, ENDPOINT '{weed.catalog_uri}', SECRET rest)"
    )
    return con


def _rows(arrow: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in columns) for r in arrow.to_pylist())


def assert_equal(mirror: Mirror, weed: SeaweedFS, *sources: str) -> None:
    """Each published table, read by pyiceberg through the REST catalog and by DuckDB
    through its REST attach, holds the publisher's rows."""
    con = _duckdb(weed)
    try:
        for source in sources:
            columns, pg = mirror.pg_rows(source)
            ident = _iceberg(mirror.config, source)
            table = mirror.catalog.load_table(ident)
            assert table.metadata_location.startswith(f"s3://{weed.warehouse}/")
            assert _rows(read_table(table), columns) == sorted(pg), f"{source}: pyiceberg"
            name = sql.Identifier("lake", *ident).as_string()
            duck = con.execute(f"SELECT * FROM {name}").to_arrow_table()
            assert _rows(duck, columns) == sorted(pg), f"{source}: DuckDB"
    finally:
        con.close()


def assert_nothing_local(since: float, *roots: Path) -> None:
    """No Parquet, Avro or metadata JSON written since ``since`` (epoch seconds) under
    ``roots`` (the work dir, the current directory: a checkout whose virtualenvs hold
    libraries' own test files), and no local folder named like the REST warehouse."""
    found = [
        p
        for root in roots
        for p in root.rglob("*")
        if (p.suffix in (".parquet", ".avro") or p.name.endswith(".metadata.json"))
        and p.stat().st_mtime >= since
    ]
    assert not found, f"files landed on the local disk: {found[:5]}"
    assert not (Path.cwd() / "iceberg-tables").exists()


def test_a_mirror_on_s3_behind_a_rest_catalog(
    lake: tuple[Mirror, Path],
    s3_env: SeaweedFS,
    pg_server: PgServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.time()
    mirror, config = lake
    weed = s3_env
    sources = [f"public.{t}" for t in TABLES]
    mirror.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), note text)",
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)",
        "CREATE PUBLICATION pub FOR TABLE orders, accounts",
        "INSERT INTO orders SELECT g, g * 1.5, 'n' || g FROM generate_series(1, 300) g",
        "INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, 10) g",
    )
    mirror.run()  # the initial copy
    assert_equal(mirror, weed, *sources)

    # Streaming: small transactions, a large one streamed and staged while it
    # arrives, and a two-phase one.
    mirror.sql(
        "INSERT INTO orders VALUES (1001, 1.00, 'new')",
        "UPDATE orders SET note = 'changed' WHERE id % 7 = 0",
        "DELETE FROM orders WHERE id % 11 = 0",
        "UPDATE accounts SET balance = balance - 10 WHERE id = 1",
    )
    mirror.run()
    assert_equal(mirror, weed, *sources)
    # The walsender streams every transaction as it is decoded (read at its start).
    pg_server.set_streaming("immediate")
    try:
        mirror.sql(
            "BEGIN",
            "INSERT INTO orders SELECT g, g, repeat('x', 200) FROM generate_series(2000, 5999) g",
            "COMMIT",
        )
        prepare_transaction(
            mirror.dsn, "g1", "UPDATE accounts SET balance = balance + 10 WHERE id = 2"
        )
        mirror.sql("COMMIT PREPARED 'g1'")
        summary = mirror.run()
    finally:
        pg_server.set_streaming("buffered")
    assert summary.staged_rows > 0  # the large transaction was staged on S3
    assert_equal(mirror, weed, *sources)

    # status names the mode a batch commits in.
    capsys.readouterr()
    assert main(["status", "--config", str(config), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["commits"] == "atomic: one REST multi-table commit per batch"

    # A cut at a requested LSN, tagged, and verify, while a subscriber runs.
    running = Running(_subscriber(mirror))
    try:
        mirror.sql("INSERT INTO orders VALUES (9000, 5.00, 'cut')")
        at = mirror.insert_lsn()
        args = ["cut", "--config", str(config), "--at-lsn", str(at), "--tag", "before-maint"]
        assert main([*args, "--json"]) == 0
        cut = json.loads(capsys.readouterr().out)
        assert cut["lsn"] == str(at)
        orders = mirror.catalog.load_table(_iceberg(mirror.config, "public.orders"))
        # Keyed by the publisher's names; the renamed table read at that snapshot.
        at_cut = read_table(orders, snapshot_id=cut["tables"]["public.orders"])
        assert 9000 in at_cut.column("id").to_pylist()
        # As the README reads a cut: its Iceberg names follow the renames.
        newest = latest_cut(mirror.catalog, cuts_table=mirror.config.sink.cuts_table)
        assert newest.iceberg["public.orders"] == ".".join(orders.name())
        # verify asks the running subscriber for a cut and compares at it.
        assert main(["verify", "--config", str(config), "--timeout", "60"]) == 0
    finally:
        running.stop()

    # Maintenance: compaction, expiry, and the sweep of a file nothing references.
    orders = mirror.catalog.load_table(_iceberg(mirror.config, "public.orders"))
    orphan = f"{orders.location()}/data/orphan-{uuid.uuid4().hex}.parquet"
    fs, path = Storage.of(orders.io.properties).filesystem(orphan)
    with fs.open_output_stream(path) as out:
        out.write(b"not referenced")
    files_before = len(list(orders.inspect.files().column("file_path")))
    assert main(["maintain", "--config", str(config), "--table", "public.orders"]) == 0
    orders = mirror.catalog.load_table(_iceberg(mirror.config, "public.orders"))
    assert len(list(orders.inspect.files().column("file_path"))) < files_before
    assert fs.get_file_info(path).type.name == "NotFound"
    assert_equal(mirror, weed, *sources)
    # The tag outlives expiry.
    assert "before-maint" in orders.metadata.refs
    # The DuckDB example reads the renamed table on S3 with the catalog's settings.
    example = EXAMPLE.parent / "read_duckdb.py"
    proc = subprocess.run(
        [sys.executable, str(example), "--config", str(config), "public.orders"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"rows: {len(mirror.pg_rows('public.orders')[1])}" in proc.stdout
    assert_nothing_local(started, mirror.config.work_dir, Path.cwd())


def _subscriber(mirror: Mirror) -> Any:
    from sparkapply.run.subscriber import Subscriber

    return Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog)


def _shell_env(extra: Mapping[str, str] = {}) -> dict[str, str]:
    """The environment of a child shell: this one's, less every SPARKAPPLY_* and AWS_*
    variable (the shell exports its own)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKAPPLY_", "AWS_"))}
    return {**keep, **extra}


def test_secrets_from_a_shell_never_show(lake: tuple[Mirror, Path], s3_env: SeaweedFS) -> None:
    mirror, config = lake
    weed = s3_env
    mirror.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, note text)",
        "CREATE TABLE accounts (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE orders, accounts",
        "INSERT INTO orders SELECT g, 'n' FROM generate_series(1, 50) g",
    )
    work = mirror.config.work_dir
    events = work.parent / "spark-events"
    events.mkdir()
    # The test server trusts local connections: the password is carried, never checked.
    dsn_password = "Pg-Secret-7e3"
    script = f"""
        set -e
        export SPARKAPPLY_SINK__CATALOG__CREDENTIAL='{weed.credential}'
        export SPARKAPPLY_SINK__CATALOG__S3__SECRET_ACCESS_KEY='{weed.secret}'
        export SPARKAPPLY_SOURCE__DSN='{mirror.dsn} password={dsn_password}'
        export SPARKAPPLY_SPARK__CONF='{{"spark.eventLog.enabled": "true",
            "spark.eventLog.dir": "file://{events}", "spark.ui.enabled": "true"}}'
        "{sys.executable}" -m sparkapply run --config "{config}" --until-caught-up
        "{sys.executable}" -m sparkapply status --config "{config}" --json
    """
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=300, env=_shell_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert any(t["rows"] == 50 for t in status["tables"] if t["source"] == "public.orders")
    secrets = (weed.secret, dsn_password, weed.credential)
    for text in (proc.stdout, proc.stderr):
        assert not [s for s in secrets if s in text]
    # Nor in any file the run left: Spark's log and event log (its conf dump), the spool.
    written = [p for p in work.parent.rglob("*") if p.is_file() and p != config]
    assert any(p.parent == events or p.parent.parent == events for p in written)
    for path in written:
        data = path.read_bytes()
        assert not [s for s in secrets if s.encode() in data], path

    # A forgotten credential: the catalog refuses it, an operator must act (exit 2).
    forgot = _shell_env({"SPARKAPPLY_SINK__CATALOG__S3__SECRET_ACCESS_KEY": weed.secret})
    proc = subprocess.run(
        [sys.executable, "-m", "sparkapply", "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=forgot,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "refused the credentials" in proc.stderr and weed.secret not in proc.stderr
    # A wrong S3 secret: the object store refuses it, exit 2 too.
    wrong = _shell_env(
        {
            "SPARKAPPLY_SINK__CATALOG__CREDENTIAL": weed.credential,
            "SPARKAPPLY_SINK__CATALOG__S3__SECRET_ACCESS_KEY": "not-the-secret",
        }
    )
    maintain = ["maintain", "--config", str(config), "--table", "public.orders", "--dry-run"]
    proc = subprocess.run(
        [sys.executable, "-m", "sparkapply", *maintain],
        capture_output=True,
        text=True,
        timeout=120,
        env=wrong,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "object store refused the credentials" in proc.stderr

    # check: a Spark task writes, reads and deletes a file on S3 with the catalog's
    # settings, and says so; with the wrong secret the warehouse check fails, alone.
    found = run_checks(mirror.config)
    assert [f.name for f in found if f.failed] == [], render_text(found)
    warehouse = next(f for f in found if f.name == "warehouse")
    assert warehouse.outcome == "pass" and "s3://" in warehouse.detail
    refused = run_checks(load_config(config, env={**os.environ, **wrong}))
    assert [f.name for f in refused if f.failed] == ["warehouse"], render_text(refused)
    assert "not-the-secret" not in render_text(refused)


@pytest.mark.slow
@pytest.mark.parametrize(
    "failpoint",
    [
        "before-catalog-swap",  # the batch's manifests written, the request not sent
        "after-catalog-swap",  # the request answered, nothing acknowledged
    ],
)
def test_kill_around_the_rest_commit(
    lake: tuple[Mirror, Path], s3_env: SeaweedFS, failpoint: str
) -> None:
    mirror, config = lake
    sources = [f"public.{t}" for t in TABLES]
    mirror.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), note text)",
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)",
        "CREATE PUBLICATION pub FOR TABLE orders, accounts",
        "INSERT INTO accounts SELECT g, 100 FROM generate_series(1, 4) g",
    )
    mirror.run()
    # Transactions touching both tables: a batch is all of them or none. The first
    # batch commits (and records a cut) before the killed run.
    for i in range(1, 7):
        if i == 2:
            mirror.run()
        mirror.sql(
            "BEGIN",
            f"INSERT INTO orders VALUES ({i}, {i}.00, 'transfer')",
            f"UPDATE accounts SET balance = balance - {i} WHERE id = 1",
            f"UPDATE accounts SET balance = balance + {i} WHERE id = 2",
            "COMMIT",
        )
    killed(failpoint, "run", "--config", str(config), "--until-caught-up")
    # What is visible is a whole batch: each table as of the newest cut.
    catalog = mirror.catalog
    cut = latest_cut(catalog, cuts_table=mirror.config.sink.cuts_table)
    for source in sources:
        table = catalog.load_table(cut.iceberg[source])
        assert lineage_lsn(table.metadata, cut.tables[source]) == applied_lsn(table), source
    mirror.run()
    assert_equal(mirror, s3_env, *sources)


def test_every_cut_on_rest_is_one_consistent_database(
    s3_env: SeaweedFS, mirror: Mirror, tmp_path: Path
) -> None:
    """Transfers between two tables, a batch of three at a time, each batch and its cut
    in one request: at every cut the moves are a prefix and the total is kept."""
    tables = ("acct_a", "acct_b", "moves")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    path = example_config(
        tmp_path / "c.toml", s3_env, mirror.dsn, namespace, tables, batch_max_transactions=3
    )
    mirror.config = load_config(path)
    mirror.slot = mirror.config.source.slot
    mirror.sql(
        "CREATE TABLE acct_a (id int PRIMARY KEY, bal int)",
        "CREATE TABLE acct_b (id int PRIMARY KEY, bal int)",
        "CREATE TABLE moves (seq int PRIMARY KEY)",
        "INSERT INTO acct_a SELECT g, 100 FROM generate_series(1, 10) g",
        "INSERT INTO acct_b SELECT g, 100 FROM generate_series(1, 10) g",
        "CREATE PUBLICATION pub FOR TABLE acct_a, acct_b, moves",
    )
    mirror.run()  # the copy
    rng = random.Random(7)
    seq = 0
    for _ in range(3):
        with psycopg.connect(mirror.dsn, autocommit=True) as conn:
            for _ in range(7):
                seq += 1
                amount, a, b = rng.randint(-50, 50), rng.randint(1, 10), rng.randint(1, 10)
                with conn.transaction():
                    conn.execute("UPDATE acct_a SET bal = bal - %s WHERE id = %s", (amount, a))
                    conn.execute("UPDATE acct_b SET bal = bal + %s WHERE id = %s", (amount, b))
                    conn.execute("INSERT INTO moves VALUES (%s)", (seq,))
        mirror.run()
    catalog = mirror.catalog
    cuts = read_cuts(catalog.load_table(cuts_identifier(mirror.config.sink.cuts_table)))
    assert len(cuts) >= 3 * 7 // 3, [str(c.lsn) for c in cuts]
    for cut in cuts:
        read = {
            t: read_table(catalog.load_table(cut.iceberg[f"public.{t}"]), snapshot_id=snap)
            for t, snap in ((t, cut.tables[f"public.{t}"]) for t in tables)
        }
        seqs = sorted(read["moves"].column("seq").to_pylist())
        assert seqs == list(range(1, len(seqs) + 1)), (str(cut.lsn), seqs)
        total = sum(read["acct_a"].column("bal").to_pylist()) + sum(
            read["acct_b"].column("bal").to_pylist()
        )
        assert total == 2000, (str(cut.lsn), total)
    assert_equal(mirror, s3_env, *(f"public.{t}" for t in tables))
