"""sparkapply on Spark 3.5, what most clusters run, and the mirror read from the very
session that applies it: Iceberg's Java runtime on its classpath (examples/read_cut_spark.py),
a consistent cut of two tables joined with SQL.

The child runs in ``.venv-spark35`` (scripts/bootstrap.sh: pyspark 3.5, Apache's
Iceberg runtime jar; everything else the suite's own). The rest of the end-to-end core
runs there too (scripts/test.sh)."""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from tests.mirror import Mirror

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PYTHON35 = REPO / ".venv-spark35" / "bin" / "python"

CHILD = """
import json, sys
from dataclasses import replace
sys.path.insert(0, {examples!r})
import pyspark
from pyspark.sql import SparkSession
from read_cut_spark import cut_views, iceberg_conf
from sparkapply.config import load_config
from sparkapply.run.subscriber import Subscriber

config = load_config({config!r})
conf = {{**config.spark.conf, **iceberg_conf(config)}}
config = replace(config, spark=replace(config.spark, conf=conf))
summary = Subscriber(config).run(until_caught_up=True)
spark = SparkSession.getActiveSession()  # the session that applied the stream
views = cut_views(spark, config, ["public.orders", "public.lines"])
rows = spark.sql(
    f"SELECT o.id, o.customer, sum(l.amount) AS total FROM {{views['public.orders']}} o "
    f"JOIN {{views['public.lines']}} l ON l.order_id = o.id GROUP BY o.id, o.customer"
).collect()
print(json.dumps({{
    "spark": pyspark.__version__,
    "transactions": summary.transactions,
    "lsn": views["lsn"],
    "totals": {{str(r["id"]): [r["customer"], str(r["total"])] for r in rows}},
}}))
"""


def test_the_product_on_spark_35_reads_its_own_mirror_at_a_cut(
    mirror: Mirror, tmp_path: Path
) -> None:
    assert PYTHON35.exists(), "scripts/bootstrap.sh makes .venv-spark35"
    mirror.sql(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL)",
        "CREATE TABLE lines (id int PRIMARY KEY, order_id int NOT NULL, amount numeric(10,2))",
        "CREATE PUBLICATION pub FOR TABLE orders, lines",
        "INSERT INTO orders SELECT g, 'c' || g % 7 FROM generate_series(1, 40) g",
        "INSERT INTO lines SELECT g, 1 + g % 40, g * 0.25 FROM generate_series(1, 200) g",
    )
    mirror.run()  # the initial copy, on the suite's newest Spark
    # Streamed on Spark 3.5: moves between orders, lines deleted and added.
    mirror.sql(
        "UPDATE lines SET order_id = 1 WHERE id % 9 = 0",
        "DELETE FROM lines WHERE id % 13 = 0",
        "INSERT INTO lines SELECT g, 1 + g % 40, 1.50 FROM generate_series(201, 260) g",
        "UPDATE orders SET customer = 'vip' WHERE id <= 3",
    )
    config = mirror.write_config(tmp_path / "c.toml")
    child = subprocess.run(
        [str(PYTHON35), "-c", CHILD.format(examples=str(REPO / "examples"), config=str(config))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    assert got["spark"].startswith("3.5.")
    assert got["transactions"] >= 4  # applied by the product on Spark 3.5
    with psycopg.connect(mirror.dsn) as conn:
        rows = conn.execute(
            "SELECT o.id, o.customer, sum(l.amount) FROM orders o JOIN lines l "
            "ON l.order_id = o.id GROUP BY o.id, o.customer"
        ).fetchall()
    want = {str(i): [c, str(Decimal(t))] for i, c, t in rows}
    assert got["totals"] == want
    mirror.assert_mirrored("public.orders", "public.lines")
