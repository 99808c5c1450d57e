"""The canonical text (verify/canonical.py), type by type: PostgreSQL's side computed
by the server in SQL, Iceberg's over the Arrow values the mirror holds for the same
values (written out here by the documented type mapping, special values included)."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sparkapply.convert.types import ColumnKind, ColumnTarget, PgColumnType, column_target
from sparkapply.source.connection import session_conninfo
from sparkapply.verify.canonical import (
    arrow_hashes,
    arrow_row_texts,
    arrow_text,
    arrow_texts,
    row_text,
    sql_bucket,
    sql_hash,
    sql_row_text,
    sql_text,
    text_bucket,
    text_hash,
)
from sparkapply.verify.publisher import check_hash

UTC = dt.UTC
D = dt.date
T = dt.datetime
FIRST, LAST = D(1, 1, 1), D(9999, 12, 31)
TS_FIRST, TS_LAST = T(1, 1, 1), T(9999, 12, 31, 23, 59, 59, 999999)

# (PostgreSQL type, SQL literals, the Arrow values the mirror holds, their Arrow type)
CASES: list[tuple[str, list[str], list[Any], pa.DataType]] = [
    ("int2", ["0", "-32768", "32767", "NULL"], [0, -32768, 32767, None], pa.int32()),
    ("int4", ["-2147483648", "7"], [-2147483648, 7], pa.int32()),
    ("int8", ["-9223372036854775808", "9223372036854775807"], [-(2**63), 2**63 - 1], pa.int64()),
    ("oid", ["4294967295", "0"], [4294967295, 0], pa.int64()),
    (
        "float4",
        ["1.1", "'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "3.4e38", "1e-45", "NULL"],
        [1.1, math.nan, math.inf, -math.inf, -0.0, 3.4e38, 1e-45, None],
        pa.float32(),
    ),
    (
        "float8",
        ["0.1", "'NaN'", "'-Infinity'", "'-0'", "1e308", "5e-324", "1e15", "NULL"],
        [0.1, math.nan, -math.inf, -0.0, 1e308, 5e-324, 1e15, None],
        pa.float64(),
    ),
    (
        "numeric(10,2)",
        ["1.5", "-0.01", "'NaN'", "12345678.90", "0", "NULL"],
        [Decimal("1.50"), Decimal("-0.01"), None, Decimal("12345678.90"), Decimal("0.00"), None],
        pa.decimal128(10, 2),
    ),
    (
        "numeric(38,10)",
        ["0.0000000001", "-1234567890123456789012345678.0123456789"],
        [Decimal("0.0000000001"), Decimal("-1234567890123456789012345678.0123456789")],
        pa.decimal128(38, 10),
    ),
    (
        "numeric",
        ["1.500", "'NaN'", "1e-20"],
        ["1.500", "NaN", "0.00000000000000000001"],
        pa.large_string(),
    ),
    ("bool", ["true", "false", "NULL"], [True, False, None], pa.bool_()),
    ("text", ["'a'", "''", "'ünïcode ✓'", "NULL"], ["a", "", "ünïcode ✓", None], pa.large_string()),
    ("varchar(5)", ["'ab'"], ["ab"], pa.large_string()),
    ("char(4)", ["'ab'", "'abcd'"], ["ab  ", "abcd"], pa.large_string()),
    ("name", ["'x'"], ["x"], pa.large_string()),
    ("bytea", ["'\\x00ff10'", "''", "NULL"], [b"\x00\xff\x10", b"", None], pa.large_binary()),
    (
        "date",
        [
            "'2026-11-24'",
            "'infinity'",
            "'-infinity'",
            "'4713-01-01 BC'",
            "'12345-01-01'",
            "'1969-12-31'",
            "NULL",
            "'0001-01-01'",
            "'9999-12-31'",
        ],
        [D(2026, 11, 24), LAST, FIRST, FIRST, LAST, D(1969, 12, 31), None, FIRST, LAST],
        pa.date32(),
    ),
    (
        "time",
        ["'10:00:00.5'", "'24:00:00'", "'00:00:00'", "NULL"],
        [dt.time(10, 0, 0, 500000), dt.time(23, 59, 59, 999999), dt.time(0), None],
        pa.time64("us"),
    ),
    (
        "timestamp",
        [
            "'2026-11-24 10:00:00.123456'",
            "'infinity'",
            "'-infinity'",
            "'1900-01-01'",
            "NULL",
            "'9999-12-31 23:59:59.999999'",
        ],
        [T(2026, 11, 24, 10, 0, 0, 123456), TS_LAST, TS_FIRST, T(1900, 1, 1), None, TS_LAST],
        pa.timestamp("us"),
    ),
    (
        "timestamptz",
        ["'2026-11-24 10:00:00+02'", "'infinity'", "'1850-06-01 12:00:00+00'", "NULL"],
        [
            T(2026, 11, 24, 8, tzinfo=UTC),
            TS_LAST.replace(tzinfo=UTC),
            T(1850, 6, 1, 12, tzinfo=UTC),
            None,
        ],
        pa.timestamp("us", tz="UTC"),
    ),
    (
        "uuid",
        ["'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", "NULL"],
        [uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").bytes, None],
        pa.uuid(),
    ),
    ("json", ["'{\"a\":  1}'", "NULL"], ['{"a":  1}', None], pa.large_string()),
    ("jsonb", ['\'{"b": 2, "a": 1}\''], ['{"a": 1, "b": 2}'], pa.large_string()),
    ("interval", ["'1 day 02:00'", "'-3 mons'"], ["1 day 02:00:00", "-3 mons"], pa.large_string()),
    ("timetz", ["'10:00:00+02'"], ["10:00:00+02"], pa.large_string()),
    (
        "int4[]",
        ["'{1,NULL,3}'", "'[0:1]={5,6}'", "'{}'", "NULL"],
        [[1, None, 3], [5, 6], [], None],
        pa.large_list(pa.int32()),
    ),
    ("text[]", ["'{\"a b\",c,NULL}'"], [["a b", "c", None]], pa.large_list(pa.large_string())),
    ("float8[]", ["'{NaN,1.5,-0}'"], [[math.nan, 1.5, -0.0]], pa.large_list(pa.float64())),
    (
        "date[]",
        ["'{infinity,2026-01-02}'", "'{NULL,-infinity}'", "'{NULL}'"],
        [[LAST, D(2026, 1, 2)], [None, FIRST], [None]],
        pa.large_list(pa.date32()),
    ),
    (
        "timestamp[]",
        ["'{NULL,infinity}'", "'{\"2026-01-02 03:04:05\",NULL}'", "'{}'", "NULL"],
        [[None, TS_LAST], [T(2026, 1, 2, 3, 4, 5), None], [], None],
        pa.large_list(pa.timestamp("us")),
    ),
    (
        "timestamptz[]",
        ["'{NULL}'", "'{-infinity,NULL}'"],
        [[None], [TS_FIRST.replace(tzinfo=UTC), None]],
        pa.large_list(pa.timestamp("us", tz="UTC")),
    ),
    (
        "time[]",
        ["'{NULL,24:00:00}'"],
        [[None, dt.time(23, 59, 59, 999999)]],
        pa.large_list(pa.time64("us")),
    ),
    (
        "bool[]",
        ["'{NULL,t,f}'"],
        [[None, True, False]],
        pa.large_list(pa.bool_()),
    ),
    (
        "numeric(6,2)[]",
        ["'{NULL,NaN,1.5}'"],
        [[None, None, Decimal("1.50")]],
        pa.large_list(pa.decimal128(6, 2)),
    ),
]


def _arrow(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
    if isinstance(arrow_type, pa.UuidType):
        return pa.ExtensionArray.from_storage(arrow_type, pa.array(values, pa.binary(16)))
    return pa.array(values, arrow_type)


@pytest.mark.parametrize(
    ("pg_type", "literals", "values", "arrow_type"), CASES, ids=[c[0] for c in CASES]
)
def test_both_sides_give_the_same_text(
    pg_dsn: str, pg_type: str, literals: list[str], values: list[Any], arrow_type: pa.DataType
) -> None:
    with psycopg.connect(session_conninfo(pg_dsn), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE t (n int, v {pg_type})")
        for n, literal in enumerate(literals):
            conn.execute(f"INSERT INTO t VALUES ({n}, ({literal})::{pg_type})")
        oid, typmod = conn.execute(
            "SELECT atttypid::int, atttypmod FROM pg_attribute "
            "WHERE attrelid = 't'::regclass AND attname = 'v'"
        ).fetchone()  # type: ignore[misc]
        target = column_target(PgColumnType(oid, typmod))
        expr = sql_text(sql.Identifier("v"), target)
        got = [r[0] for r in conn.execute(sql.SQL("SELECT {} FROM t ORDER BY n").format(expr))]
        row = sql_row_text([expr, sql.SQL("n::text")])
        hashes = conn.execute(
            sql.SQL("SELECT {}, {}, {} FROM t ORDER BY n").format(
                row, sql_hash(row), sql_bucket(row, 16)
            )
        ).fetchall()
    array = _arrow(values, arrow_type)
    mirror = arrow_text(array, target)
    assert mirror == got
    for n, (text, h, bucket) in enumerate(hashes):
        assert row_text([mirror[n], str(n)]) == text
        assert (text_hash(text), text_bucket(text, 16)) == (h, bucket)
    # The vectorised hashes, and a slice at an offset into its buffers, as Arrow
    # hands a scan's batches over.
    texts = arrow_texts(array, target)
    numbers = pa.array([str(n) for n in range(len(values))])
    assert arrow_row_texts([texts, numbers]).to_pylist() == [t for t, _, _ in hashes]
    row_hashes, prefixes = arrow_hashes([texts, numbers])
    assert [(int(h), int(p) % 16) for h, p in zip(row_hashes, prefixes, strict=True)] == [
        (h, bucket) for _, h, bucket in hashes
    ]
    doubled = pa.concat_arrays([array, array])
    assert arrow_text(doubled.slice(len(values)), target) == got
    assert arrow_text(pa.chunked_array([array[:1], array[1:]], array.type), target) == got


def _lengths() -> list[str]:
    """Texts of every length around lookup3's 12-byte blocks (ASCII, then 2- to 4-byte
    characters), the separators a row text holds, and a long one."""
    texts = ["x" * n for n in range(50)]
    texts += [("é€😀" * 20)[:n] for n in range(30)]
    texts += ["a\x1fb\x1ec\x1dd", "", "\x7f" * 13, "long " * 20_000]
    return texts


def test_the_row_hash_is_postgresqls_hashtextextended(pg_dsn: str) -> None:
    texts = _lengths()
    with psycopg.connect(session_conninfo(pg_dsn), autocommit=True) as conn:
        server = [
            r[0]
            for r in conn.execute(
                sql.SQL(
                    "SELECT {} FROM unnest(%s::text[]) WITH ORDINALITY u(v, n) ORDER BY n"
                ).format(sql_hash(sql.SQL("v"))),
                (texts,),
            )
        ]
        check_hash(conn)  # the same check verify makes before it hashes a table
    assert [text_hash(t) for t in texts] == server
    array = pa.array(texts)
    for variant in (array, array.cast(pa.large_string())):
        assert arrow_hashes([variant])[0].tolist() == server
    # A slice at an offset into its buffers, as Arrow hands a scan's batches over.
    assert arrow_hashes([array.slice(7, 40)])[0].tolist() == server[7:47]


def test_arrow_hashes_match_one_by_one_over_many_rows_and_none() -> None:
    texts = ["é" * (n % 70) + str(n) for n in range(200_000)]
    hashes, prefixes = arrow_hashes([pa.array(texts)])
    picked = range(0, len(texts), 997)
    assert [int(hashes[i]) for i in picked] == [text_hash(texts[i]) for i in picked]
    assert [int(prefixes[i]) % 64 for i in picked] == [text_bucket(texts[i], 64) for i in picked]
    empty_hashes, empty_prefixes = arrow_hashes([pa.array([], pa.string())])
    assert len(empty_hashes) == len(empty_prefixes) == 0


def test_a_report_counts_every_difference_and_lists_the_first() -> None:
    """The differences column is every differing row found, not the rows listed."""
    from sparkapply.lsn import Lsn
    from sparkapply.verify.command import Difference, TableVerdict, VerifyReport

    listed = [Difference("different", f"id='{i}'", ("v",)) for i in range(20)]
    verdict = TableVerdict("public.cl", "public.cl", 1, 100, 100, 1, 2, listed, differing=80)
    text = VerifyReport(Lsn(0x14A2338), [verdict]).render()
    assert "DIFFERS  80" in text
    assert "public.cl: ... and 60 more" in text
    assert text.count("public.cl: different:") == 20


@pytest.mark.parametrize("width", [1, 99, 100, 250, 1600])
def test_a_wide_row_has_one_text(pg_dsn: str, width: int) -> None:
    """A row of more columns than a function takes arguments (100) has the same text
    and hash on the server as on the mirror's side; nulls included."""
    cols = [
        sql.SQL("{}::text").format(sql.Literal(None if i % 7 == 3 else f"v{i}"))
        for i in range(width)
    ]
    values: list[str | None] = [None if i % 7 == 3 else f"v{i}" for i in range(width)]
    with psycopg.connect(session_conninfo(pg_dsn), autocommit=True) as conn:
        row = sql_row_text(cols)
        got = conn.execute(sql.SQL("SELECT {}, {}").format(row, sql_hash(row))).fetchone()
    assert got is not None
    text, h = got
    assert text == row_text(values)
    assert h == text_hash(text)
    columns = [pa.array([v], pa.large_string()) for v in values]
    assert arrow_row_texts(columns).to_pylist() == [text]


def _target(kind: ColumnKind, element: ColumnKind | None = None) -> ColumnTarget:
    """The target of an Iceberg column kind, as verify's shape holds it."""
    oids = {
        ColumnKind.DATE: 1082,
        ColumnKind.TIME: 1083,
        ColumnKind.TIMESTAMP: 1114,
        ColumnKind.TIMESTAMPTZ: 1184,
    }
    if element is not None:
        array_oids = {1082: 1182, 1083: 1183, 1114: 1115, 1184: 1185}
        return column_target(PgColumnType(array_oids[oids[element]], -1))
    return column_target(PgColumnType(oids[kind], -1))


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        # Out-of-range values (written by another tool) need clamping: the nulls beside
        # them stay null, not the bound.
        (ColumnKind.DATE, pa.array([None, 3_000_000, None, -800_000], pa.int32())),
        (ColumnKind.TIMESTAMP, pa.array([None, 2**62, -(2**62)], pa.int64())),
        (ColumnKind.TIMESTAMPTZ, pa.array([-(2**62), None], pa.int64())),
        (ColumnKind.TIME, pa.array([None, 86_400_000_000], pa.int64())),
    ],
)
def test_a_null_beside_clamped_values_stays_null(kind: ColumnKind, values: pa.Array) -> None:
    from sparkapply.convert.temporal import DATE_MAX, DATE_MIN, TIMESTAMP_MAX, TIMESTAMP_MIN

    target = _target(kind)
    arrow_type = target.arrow_type
    array = values
    typed = pa.Array.from_buffers(arrow_type, len(array), array.buffers())
    low, high = {
        ColumnKind.DATE: (DATE_MIN, DATE_MAX),
        ColumnKind.TIME: (0, 86_400_000_000 - 1),
    }.get(kind, (TIMESTAMP_MIN, TIMESTAMP_MAX))
    want = [None if v is None else str(min(max(v, low), high)) for v in values.to_pylist()]
    assert arrow_text(typed, target) == want
    # The same inside a list, a null element and a null list beside them.
    lists = pa.LargeListArray.from_arrays(pa.array([0, len(typed), len(typed)], pa.int64()), typed)
    lists = pa.concat_arrays([lists, pa.nulls(1, lists.type)])
    element_target = _target(ColumnKind.LIST, kind)
    framed = "[" + "\x1d".join("\x1e" if v is None else v for v in want) + "]"
    assert arrow_text(lists, element_target) == [framed, "[]", None]


def test_a_null_list_backed_by_values_stays_null() -> None:
    """A null list may span values (Arrow allows it, and a writer may leave them):
    they belong to no list, and the lists after it keep their own."""
    values = pa.array([1, None, 3, 4], pa.int32())
    lists = pa.LargeListArray.from_arrays(
        pa.array([0, 2, 3, 4, 4], pa.int64()),
        values,
        mask=pa.array([True, False, False, True]),
    )
    target = column_target(PgColumnType(1007, -1))  # int4[]
    assert arrow_text(lists, target) == [None, "[3]", "[4]", None]
    assert arrow_text(lists.slice(1), target) == ["[3]", "[4]", None]
