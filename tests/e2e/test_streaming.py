"""Streamed transactions: interleaving, subtransaction aborts, schema changes mid-stream."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import PgServer
from tests.mirror import Mirror

pytestmark = pytest.mark.integration


@pytest.fixture()
def immediate(pg_server: PgServer) -> object:
    pg_server.set_streaming("immediate")
    yield None
    pg_server.set_streaming("buffered")


def test_interleaved_streams_and_ordinary_transactions(mirror: Mirror, immediate: object) -> None:
    mirror.sql(
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE a, b",
    )
    mirror.run()
    with (
        psycopg.connect(mirror.dsn) as s1,
        psycopg.connect(mirror.dsn) as s2,
        psycopg.connect(mirror.dsn, autocommit=True) as s3,
    ):
        for chunk in range(5):
            s1.execute(
                "INSERT INTO a SELECT g, 's1' FROM generate_series(%s::int, %s::int) g",
                (chunk * 1000 + 1, chunk * 1000 + 1000),
            )
            s2.execute(
                "INSERT INTO b SELECT g, 's2' FROM generate_series(%s::int, %s::int) g",
                (chunk * 1000 + 1, chunk * 1000 + 1000),
            )
            # Ordinary transactions commit between the streams' chunks.
            s3.execute("INSERT INTO a VALUES (%s, 'between')", (100000 + chunk,))
            s3.execute("UPDATE a SET v = 'touched' WHERE id = %s", (100000 + chunk,))
        s2.execute("UPDATE b SET v = 'updated in stream' WHERE id % 3 = 0")
        s2.commit()  # the later-started stream commits first
        s1.execute("DELETE FROM a WHERE id % 5 = 0")
        s1.commit()
    mirror.run()
    mirror.assert_mirrored("public.a", "public.b")


def test_savepoints_rolled_back_and_kept(mirror: Mirror, immediate: object) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE u (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE t, u",
    )
    mirror.run()
    mirror.sql("INSERT INTO u SELECT generate_series(1, 10)")
    with psycopg.connect(mirror.dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, 'top' FROM generate_series(1, 200) g")
        conn.execute("SAVEPOINT a")
        conn.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(201, 400) g")
        conn.execute("SAVEPOINT b")
        conn.execute("INSERT INTO t SELECT g, 'b' FROM generate_series(401, 600) g")
        conn.execute("SAVEPOINT c")
        conn.execute("UPDATE t SET v = 'c' WHERE id <= 100")
        conn.execute("RELEASE SAVEPOINT c")
        conn.execute("ROLLBACK TO SAVEPOINT b")  # drops b and c (aborts arrive child first)
        conn.execute("INSERT INTO t SELECT g, 'after b' FROM generate_series(601, 700) g")
        conn.execute("SAVEPOINT d")
        conn.execute("TRUNCATE u")
        conn.execute("ROLLBACK TO SAVEPOINT d")  # a rolled-back TRUNCATE
        conn.execute("SAVEPOINT e")  # a subtransaction that changes nothing
        conn.execute("ROLLBACK TO SAVEPOINT e")
        conn.execute("RELEASE SAVEPOINT a")
        conn.execute("SAVEPOINT f")
        conn.execute("DELETE FROM t WHERE id > 650")
        conn.execute("RELEASE SAVEPOINT f")
        conn.commit()
    with psycopg.connect(mirror.dsn) as conn:
        conn.execute("INSERT INTO t VALUES (9999, 'aborted top')")
        conn.execute("SAVEPOINT x")
        conn.execute("INSERT INTO t VALUES (9998, 'aborted sub')")
        conn.rollback()  # STREAM ABORT of the top xid
    mirror.run()
    mirror.assert_mirrored("public.t", "public.u")


def test_add_and_drop_column_mid_stream(mirror: Mirror, immediate: object) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, a text, b int)",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    with psycopg.connect(mirror.dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, 'a' || g, g FROM generate_series(1, 300) g")
        conn.execute("ALTER TABLE t ADD COLUMN c bigint")
        conn.execute("INSERT INTO t SELECT g, 'a' || g, g, g * 10 FROM generate_series(301, 600) g")
        conn.execute("UPDATE t SET c = -1 WHERE id <= 10")
        conn.execute("ALTER TABLE t DROP COLUMN b")
        conn.execute("INSERT INTO t SELECT g, 'late', g FROM generate_series(601, 700) g")
        conn.execute("ALTER TABLE t ALTER COLUMN id TYPE bigint")  # a widening Iceberg allows
        conn.execute("INSERT INTO t VALUES (5000000000, 'big', 1)")
        conn.commit()
    mirror.run()
    mirror.assert_mirrored("public.t")


def test_bulk_transaction_over_work_mem(mirror: Mirror) -> None:
    """64kB logical_decoding_work_mem: a 20,000-row transaction streams in chunks."""
    mirror.sql(
        "CREATE TABLE big (id bigint PRIMARY KEY, payload text, amount numeric(12,2))",
        "CREATE PUBLICATION pub FOR TABLE big",
    )
    mirror.run()
    mirror.sql(
        "BEGIN; INSERT INTO big SELECT g, md5(g::text), g / 7.0 FROM generate_series(1, 20000) g;"
        " UPDATE big SET payload = 'x' WHERE id % 100 = 0; DELETE FROM big WHERE id % 333 = 0;"
        " COMMIT"
    )
    mirror.run()
    mirror.assert_mirrored("public.big")


def test_array_element_type_widens(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, tags int[])",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    mirror.sql("INSERT INTO t VALUES (1, '{1,2}')")
    mirror.run()
    mirror.sql(
        "ALTER TABLE t ALTER COLUMN tags TYPE bigint[]",
        "INSERT INTO t VALUES (2, '{5000000000,NULL}')",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
    assert "long" in str(mirror.catalog.load_table(("public", "t")).schema().find_field("tags"))
