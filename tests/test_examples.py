"""The runnable examples in ``examples/``, run as a user runs them, against a real mirror.

Each reading example (pyiceberg, DuckDB's iceberg extension from PyPI, Spark) must
print exactly the publisher's rows, after updates and deletes (position deletes) were
applied; the quickstart config must replicate with only environment overrides; the
two-phase example must show a prepared transaction appearing at COMMIT PREPARED only.
The configs that need outside services (a REST catalog, an object store, a cluster)
are loaded and checked for the keys they promise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from sparkapply.config import load_config
from tests.mirror import Mirror, slot_for

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc.stdout


def _expected(dsn: str, table: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT * FROM {table}").fetchall()  # a fixed test table name
    return {"\t".join("NULL" if v is None else str(v) for v in row) for row in rows}


def _printed(output: str) -> tuple[int, list[str], set[str]]:
    """The ``rows: N`` figure, the header and the row lines an example printed."""
    lines = output.strip().splitlines()
    count_lines = [line for line in lines if line.startswith("rows: ")]
    assert len(count_lines) == 1, output
    start = lines.index(count_lines[0]) + 1
    header = lines[start].split("\t")
    return int(count_lines[0].split()[1]), header, set(lines[start + 1 :])


@pytest.fixture()
def mirrored(mirror: Mirror, tmp_path: Path) -> tuple[Mirror, Path]:
    mirror.sql(
        "CREATE TABLE items (id int PRIMARY KEY, name text, qty int, price numeric(10,2))",
        "INSERT INTO items SELECT g, 'item ' || g, g % 5, g / 4.0 FROM generate_series(1, 300) g",
        "CREATE PUBLICATION pub FOR TABLE items",
    )
    mirror.run()
    mirror.sql(
        "UPDATE items SET qty = NULL, name = 'renamed' WHERE id % 10 = 0",
        "DELETE FROM items WHERE id % 7 = 0",
        "INSERT INTO items VALUES (1000, 'late', 1, 9.99)",
    )
    mirror.run()
    mirror.assert_mirrored("public.items")
    return mirror, mirror.write_config(tmp_path / "mirror.toml")


@pytest.mark.parametrize("example", ["read_pyiceberg.py", "read_duckdb.py", "read_spark.py"])
def test_reading_examples_print_the_publishers_rows(
    mirrored: tuple[Mirror, Path], example: str
) -> None:
    mirror, config = mirrored
    out = _run(str(EXAMPLES / example), "--config", str(config), "public.items", "--limit", "9999")
    count, header, rows = _printed(out)
    want = _expected(mirror.dsn, "items")
    assert header == ["id", "name", "qty", "price"]
    assert count == len(want) == 300 - 42 + 1
    assert rows == want, sorted(rows ^ want)[:10]


def test_quickstart_config_replicates_with_environment_overrides(
    pg_dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
        conn.execute("INSERT INTO accounts SELECT g, g * 10 FROM generate_series(1, 50) g")
        conn.execute("CREATE PUBLICATION app_pub FOR TABLE accounts")
    env = {
        "SPARKAPPLY_SOURCE__DSN": pg_dsn,
        "SPARKAPPLY_SOURCE__SLOT": slot_for(pg_dsn),
        "SPARKAPPLY_WORK_DIR": str(tmp_path / "work"),
    }
    config = str(EXAMPLES / "quickstart.toml")
    _run("-m", "sparkapply", "run", "--until-caught-up", "--config", config, env=env)
    out = _run(
        str(EXAMPLES / "read_pyiceberg.py"),
        "--config",
        config,
        "public.accounts",
        "--limit",
        "100",
        env=env,
    )
    count, _, rows = _printed(out)
    assert count == 50
    assert rows == _expected(pg_dsn, "accounts")
    # Spark's own output went to the work dir's log, not to the terminal.
    assert (tmp_path / "work" / "logs" / "spark.log").is_file()


def test_two_phase_example(pg_dsn: str, tmp_path: Path) -> None:
    env = {
        "SPARKAPPLY_SOURCE__DSN": pg_dsn,
        "SPARKAPPLY_SOURCE__SLOT": slot_for(pg_dsn),
        "SPARKAPPLY_WORK_DIR": str(tmp_path / "work"),
    }
    out = _run(
        str(EXAMPLES / "two_phase.py"), "--config", str(EXAMPLES / "quickstart.toml"), env=env
    )
    steps = {
        line.split(" iceberg: ")[0].strip(): line.split(" iceberg: ")[1]
        for line in out.splitlines()
        if " iceberg: " in line
    }
    assert steps == {
        "initial copy": "{1: 100, 2: 100}",
        "PREPARE TRANSACTION 'transfer-1'": "{1: 100, 2: 100}",
        "COMMIT PREPARED 'transfer-1'": "{1: 70, 2: 130}",
        "PREPARE + ROLLBACK PREPARED 'transfer-2'": "{1: 70, 2: 130}",
    }, out
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)


def test_service_configs_load_with_their_keys() -> None:
    rest = load_config(EXAMPLES / "rest-s3.toml", env={})
    props = rest.catalog_properties()
    assert props["type"] == "rest" and props["uri"].startswith("https://")
    for key in ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key", "s3.region"):
        assert key in props, key
    assert rest.sink.tables == {"public.orders": "sales.orders"}
    secret = load_config(
        EXAMPLES / "rest-s3.toml", env={"SPARKAPPLY_SINK__CATALOG__s3.secret-access-key": "k"}
    )
    assert secret.catalog_properties()["s3.secret-access-key"] == "k"

    cluster = load_config(EXAMPLES / "cluster.toml", env={})
    assert cluster.spark.master.startswith("spark://")
    assert str(cluster.work_dir) == "/mnt/shared/sparkapply"
    assert cluster.spark.conf["spark.pyspark.python"].endswith("/python")

    script = EXAMPLES / "spark-submit.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "--master" in script.read_text() and "run --config" in script.read_text()
