"""Row semantics: TOAST, REPLICA IDENTITY FULL, TRUNCATE, multi-table, the type set."""

from __future__ import annotations

import psycopg
import pytest

from sparkapply.run.batch import BatchStats
from tests.mirror import Mirror

pytestmark = pytest.mark.integration


def test_unchanged_toast_keeps_stored_value(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE doc (id int PRIMARY KEY, title text, body text)",
        "ALTER TABLE doc ALTER COLUMN body SET STORAGE EXTERNAL",  # toasted, uncompressed
        "CREATE PUBLICATION pub FOR TABLE doc",
    )
    mirror.run()
    mirror.sql(
        "INSERT INTO doc SELECT g, 't' || g, repeat(md5(g::text), 400)"
        " FROM generate_series(1, 20) g"
    )
    mirror.run()  # the large values are now in Iceberg, from an earlier batch
    mirror.sql(
        "UPDATE doc SET title = 'retitled' WHERE id <= 10",  # body sent as unchanged TOAST
        "UPDATE doc SET id = id + 100 WHERE id <= 3",  # key change, body unchanged
        # In one transaction: a new row, then an update of it that leaves body unchanged.
        "BEGIN; INSERT INTO doc VALUES (50, 'new', repeat('x', 10000));"
        " UPDATE doc SET title = 'newer' WHERE id = 50; COMMIT",
    )
    mirror.run()
    mirror.assert_mirrored("public.doc")


def test_replica_identity_full_with_duplicates(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE ev (kind text, n int, note text)",
        "ALTER TABLE ev REPLICA IDENTITY FULL",
        "CREATE PUBLICATION pub FOR TABLE ev",
    )
    mirror.run()
    mirror.sql(
        "INSERT INTO ev VALUES ('a', 1, 'x'), ('a', 1, 'x'), ('a', 1, 'x'), ('b', 2, NULL),"
        " ('b', 2, NULL), ('c', 3, 'z')"
    )
    mirror.run()
    # ctid-targeted statements change exactly one of the duplicates.
    mirror.sql(
        "DELETE FROM ev WHERE ctid = (SELECT min(ctid) FROM ev WHERE kind = 'a')",
        "UPDATE ev SET note = 'one' WHERE ctid = (SELECT max(ctid) FROM ev WHERE kind = 'b')",
        "BEGIN; INSERT INTO ev VALUES ('d', 4, 'in batch'), ('d', 4, 'in batch');"
        " DELETE FROM ev WHERE ctid = (SELECT min(ctid) FROM ev WHERE kind = 'd'); COMMIT",
    )
    batches: list[BatchStats] = []
    mirror.run(on_batch=batches.append)
    mirror.assert_mirrored("public.ev")
    assert {r.path for b in batches for r in b.results} == {"full"}  # the vectorised fold


def test_truncate_with_dml_and_multi_table(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE p (id int PRIMARY KEY, v text)",
        "CREATE TABLE c (id int PRIMARY KEY, p_id int, v text)",
        "CREATE PUBLICATION pub FOR TABLE p, c",
    )
    mirror.run()
    mirror.sql(
        "INSERT INTO p SELECT g, 'p' FROM generate_series(1, 100) g",
        "INSERT INTO c SELECT g, g, 'c' FROM generate_series(1, 100) g",
    )
    mirror.run()
    mirror.sql(
        "BEGIN; INSERT INTO p VALUES (1000, 'before truncate');"
        " TRUNCATE p, c;"
        " INSERT INTO p VALUES (1, 'after'), (2, 'after'); INSERT INTO c VALUES (1, 1, 'after');"
        " UPDATE p SET v = 'updated after' WHERE id = 2; COMMIT",
        "BEGIN; UPDATE p SET v = 'multi' WHERE id = 1;"
        " INSERT INTO c VALUES (2, 1, 'multi'); COMMIT",
    )
    mirror.run()
    mirror.assert_mirrored("public.p", "public.c")


def test_wide_type_set(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
        "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
        """CREATE TABLE ty (
            id bigint PRIMARY KEY, i2 int2, i4 int4, i8 int8,
            n12 numeric(12,4), nbig numeric(50,10), nfree numeric,
            f4 float4, f8 float8, t text, vc varchar(10), b bytea, bo bool,
            d date, ts timestamp, tstz timestamptz, u uuid, j json, jb jsonb,
            ai int[], at text[], m mood, dom posint)""",
        "CREATE PUBLICATION pub FOR TABLE ty",
    )
    mirror.run()
    mirror.sql(
        """INSERT INTO ty VALUES
        (1, 1, 2, 3, 12345678.1234, 1234567890123456789012345678901234567890.0123456789,
         'NaN', 'NaN', 'Infinity', 'hello', 'short', '\\x00ff10', true, '2024-02-29',
         '2024-01-01 12:34:56.789', '2024-06-30 23:59:59.999999+02',
         'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2]}', '{"b": {"c": null}}',
         '{1,2,NULL}', '{"x y","z,w",NULL}', 'happy', 7),
        (2, -32768, -2147483648, -9223372036854775808, 'NaN', -1.5, 1e-30,
         '-Infinity', -0.0, '', NULL, '\\x', false, '1970-01-01', '1999-12-31 23:59:59',
         '1970-01-01 00:00:00+00', '00000000-0000-0000-0000-000000000000', 'null', '[]',
         '{}', '{}', 'sad', 1),
        (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
        "UPDATE ty SET f8 = 'NaN', t = 'ünïcødé ✓' WHERE id = 2",
    )
    mirror.run()
    mirror.assert_mirrored("public.ty")


def test_slot_advances_while_only_unpublished_tables_change(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE published (id int PRIMARY KEY)",
        "CREATE TABLE unpublished (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE published",
    )
    mirror.run()
    before = mirror.confirmed_lsn()
    mirror.sql("INSERT INTO unpublished SELECT g, md5(g::text) FROM generate_series(1, 5000) g")
    after_writes = str(mirror.insert_lsn())
    mirror.run()
    confirmed = mirror.confirmed_lsn()
    with psycopg.connect(mirror.dsn) as conn:
        ok = conn.execute(
            "SELECT %s::pg_lsn >= %s::pg_lsn AND %s::pg_lsn > %s::pg_lsn",
            (confirmed, after_writes, confirmed, before),
        ).fetchone()
    assert ok == (True,), (before, after_writes, mirror.confirmed_lsn())
