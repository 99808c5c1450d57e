"""The canonical text over generated values of every mapped type: the publisher's (SQL,
on the server) equals the mirror's (over the Arrow values the product's conversion
makes of the text pgoutput sends), nulls, special values and null array elements
included. The end-to-end proof, through a real mirror, is
``tests/e2e/test_verify_values.py``. ``VALUES_EXAMPLES=N`` tries N lists of values a
type (default 5, for the suite's time)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from sparkapply.convert.types import TEXT_OID, PgColumnType, column_target
from sparkapply.convert.values import to_arrow
from sparkapply.source.connection import session_conninfo
from sparkapply.verify.canonical import arrow_text, sql_text
from tests.conftest import PgServer
from tests.verify.values import COLUMNS, TYPES_SQL, Column, values_of


@pytest.fixture(scope="module")
def conn(pg_server: PgServer) -> Iterator[psycopg.Connection[Any]]:
    """One database for the module (a database a test would cost more than its values)."""
    name = pg_server.create_database("values")
    try:
        with psycopg.connect(session_conninfo(pg_server.dsn(name)), autocommit=True) as c:
            for statement in TYPES_SQL:
                c.execute(statement)
            yield c
    finally:
        pg_server.drop_database(name)


def _column_type(conn: psycopg.Connection[Any], table: sql.Identifier) -> PgColumnType:
    """The column's type as the mirror takes it (declared with more than one
    dimension: text, as ``copy/snapshot.py`` describes it)."""
    row = conn.execute(
        "SELECT atttypid::int, atttypmod, attndims FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attname = 'v'",
        (table.as_string(conn),),
    ).fetchone()
    assert row is not None
    oid, typmod, ndims = row
    return PgColumnType(TEXT_OID, -1) if ndims > 1 else PgColumnType(oid, typmod)


@pytest.mark.parametrize("column", COLUMNS, ids=[c[1] for c in COLUMNS])
def test_generated_values_have_one_text_on_both_sides(
    conn: psycopg.Connection[Any], column: Column
) -> None:
    name, pg_type, specials = column
    table = sql.Identifier(f"t_{name}")
    conn.execute(sql.SQL("CREATE TABLE {} (n int, v {})").format(table, sql.SQL(pg_type)))
    ctype = _column_type(conn, table)
    target = column_target(ctype)
    canonical = sql_text(sql.Identifier("v"), target)
    # What pgoutput sends: the type's output function, null as null.
    sent = sql.SQL("CASE WHEN v IS NULL THEN NULL ELSE format('%s', v) END")
    select = sql.SQL("SELECT {}, {} FROM {} ORDER BY n").format(sent, canonical, table)

    @settings(
        max_examples=int(os.environ.get("VALUES_EXAMPLES", "5")),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.lists(values_of(pg_type, specials), min_size=1, max_size=6))
    def check(values: list[str | None]) -> None:
        rows = sql.SQL(", ").join(
            sql.SQL("({}, {}::{})").format(
                sql.Literal(n),
                sql.SQL("NULL") if value is None else sql.Literal(value),
                sql.SQL(pg_type),
            )
            for n, value in enumerate(values)
        )
        conn.execute(sql.SQL("TRUNCATE {}").format(table))
        conn.execute(sql.SQL("INSERT INTO {} VALUES {}").format(table, rows))
        texts, publisher = zip(*conn.execute(select).fetchall(), strict=True)
        mirror = to_arrow(ctype, [None if t is None else t.encode() for t in texts])
        assert arrow_text(mirror, target) == list(publisher), values

    check()
