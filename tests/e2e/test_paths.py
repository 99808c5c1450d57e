"""End to end: a work dir and warehouse whose path holds a space, brackets and non-ASCII
characters, and PostgreSQL names that need quoting (a space, a dash, mixed case, a
quote, a slash) — initial copy, then streamed changes, compared row by row in
PostgreSQL, pyiceberg and DuckDB."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import psycopg
import pytest
from psycopg import sql

from sparkapply import location
from tests.mirror import Mirror

pytestmark = pytest.mark.integration

SALES = "Sales Dept.Order-Items"
ODD = 'it\'s "odd".a/b#c'  # schema it's "odd", table a/b#c


def _create(m: Mirror) -> None:
    m.sql(
        'CREATE SCHEMA "Sales Dept"',
        'CREATE TABLE "Sales Dept"."Order-Items" ('
        ' id int PRIMARY KEY, "MixedCase" text, "it\'s ""q""" numeric(10,2), "Ünï" text)',
        'INSERT INTO "Sales Dept"."Order-Items"'
        " SELECT g, 'm' || g, g / 4.0, 'ü' || g FROM generate_series(1, 300) g",
        'CREATE SCHEMA "it\'s ""odd"""',
        'CREATE TABLE "it\'s ""odd"""."a/b#c" ("Key" int PRIMARY KEY, v text)',
        'INSERT INTO "it\'s ""odd"""."a/b#c" SELECT g, \'v\' FROM generate_series(1, 50) g',
        'CREATE PUBLICATION pub FOR TABLE "Sales Dept"."Order-Items", "it\'s ""odd"""."a/b#c"',
    )


def _change(m: Mirror) -> None:
    m.sql(
        'INSERT INTO "Sales Dept"."Order-Items"'
        # Large enough to be streamed (logical_decoding_work_mem is 64kB in the tests):
        # the stream's spool file lives under the odd work dir too.
        " SELECT g, 'n' || g || repeat('x', 40), g / 8.0, 'é' || g"
        " FROM generate_series(301, 3000) g",
        'UPDATE "Sales Dept"."Order-Items" SET "MixedCase" = \'changed\' WHERE id % 10 = 0',
        'DELETE FROM "Sales Dept"."Order-Items" WHERE id % 7 = 0',
        'UPDATE "Sales Dept"."Order-Items" SET id = id + 100000 WHERE id BETWEEN 1 AND 5',
        'UPDATE "it\'s ""odd"""."a/b#c" SET v = \'w\' WHERE "Key" % 3 = 0',
        'DELETE FROM "it\'s ""odd"""."a/b#c" WHERE "Key" > 40',
    )


def _split(table: str) -> tuple[str, str]:
    if table == ODD:
        return 'it\'s "odd"', "a/b#c"
    ns, name = table.split(".")
    return ns, name


def _pg_rows(m: Mirror, table: str) -> list[tuple[Any, ...]]:
    ns, name = _split(table)
    with psycopg.connect(m.dsn) as conn:
        q = sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(ns), sql.Identifier(name))
        return sorted(conn.execute(q).fetchall(), key=repr)


def _extension(module: Any, name: str) -> str:
    root = os.path.dirname(module.__file__)
    (path,) = glob.glob(os.path.join(root, "extensions", "*", f"{name}.duckdb_extension"))
    return str(path)


def _duckdb_rows(metadata_location: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{_extension(duckdb_extension_avro, 'avro')}'")
        con.execute(f"LOAD '{_extension(duckdb_extension_iceberg, 'iceberg')}'")
        rows = con.execute("SELECT * FROM iceberg_scan(?)", [metadata_location]).fetchall()
    finally:
        con.close()
    return sorted(rows, key=repr)


def _check(m: Mirror, table: str) -> None:
    ns, name = _split(table)
    ice = m.catalog.load_table((ns, name))
    # pyiceberg, compared row by row with PostgreSQL (the usual mirror check) ...
    if table == SALES:
        m.assert_mirrored(table)
    else:
        _, rows = _iceberg_rows(m, ns, name)
        assert sorted(rows, key=repr) == _pg_rows(m, table)
    # ... and DuckDB's iceberg extension reads the same rows from the same files.
    pg = _pg_rows(m, table)
    duck = _duckdb_rows(ice.metadata_location)
    assert len(duck) == len(pg)
    if table != SALES:  # numeric compares as Decimal in both; text and ints as they are
        assert duck == pg
    else:
        assert [(r[0], r[1], r[3]) for r in duck] == [(r[0], r[1], r[3]) for r in pg]
        assert [r[2] for r in duck] == [r[2] for r in pg]


def _iceberg_rows(m: Mirror, ns: str, name: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    arrow = m.catalog.load_table((ns, name)).scan().to_arrow()
    return arrow.column_names, [tuple(r.values()) for r in arrow.to_pylist()]


def _files(m: Mirror, ns: str, name: str) -> list[str]:
    table = m.catalog.load_table((ns, name))
    return [t.file.file_path for t in table.scan().plan_files()]


def test_paths_and_names_that_need_quoting(pg_dsn: str, tmp_path: Path, spark: object) -> None:
    work = tmp_path / "tmp" / "wörk [0] x"
    m = Mirror(pg_dsn, work, spark)
    _create(m)
    m.run()  # the initial copy
    m.sql("INSERT INTO \"Sales Dept\".\"Order-Items\" VALUES (9999, 'x', 1.5, 'ö')")
    m.run()
    _change(m)
    m.run()
    # A prepared transaction is staged under work_dir/prepared and applied at COMMIT
    # PREPARED, also with the odd path.
    with psycopg.connect(m.dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute('UPDATE "Sales Dept"."Order-Items" SET "Ünï" = \'prepared\' WHERE id % 11 = 0')
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal("g [1] ö")))
    m.run()
    assert list((work / "prepared").glob("*.json"))
    m.sql("COMMIT PREPARED 'g [1] ö'")
    m.run()

    # The catalog (SQLite, its URL escaped) and the warehouse (unescaped) are under the
    # work dir as written, not under an escaped twin of it.
    assert (work / "catalog.db").is_file()
    assert sorted(p.name for p in work.parent.iterdir()) == ["wörk [0] x"]
    sales = m.catalog.load_table(("Sales Dept", "Order-Items"))
    assert sales.location() == location.from_path(work / "warehouse" / "Sales Dept" / "Order-Items")
    odd = m.catalog.load_table(('it\'s "odd"', "a/b#c"))
    odd_dir = location.local_path(odd.location())
    assert odd_dir is not None and "#" not in odd_dir and Path(odd_dir).is_dir()
    assert Path(odd_dir).parent.name == location.path_segment('it\'s "odd"')

    # Every data file is spelled as a location under the table's own, and exists.
    for ns, name in (("Sales Dept", "Order-Items"), ('it\'s "odd"', "a/b#c")):
        table = m.catalog.load_table((ns, name))
        files = _files(m, ns, name)
        assert files
        for f in files:
            assert f.startswith(table.location() + "/data/"), f
            path = location.local_path(f)
            assert path is not None and os.path.isfile(path), f

    for table in (SALES, ODD):
        _check(m, table)
