"""The executor side of the copy: COPY text parsing, conversion, one slice end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.convert.types import PgColumnType
from sparkapply.convert.values import to_arrow
from sparkapply.copy.tasks import (
    SliceTask,
    chunk_to_table,
    parse_copy_text,
    run_slice,
    unescape,
)
from sparkapply.errors import ConnectionLostError, ErrorKind, SourceError, TableMovedError
from sparkapply.source.connection import SESSION_OPTIONS
from sparkapply.storage import Storage

TEXT = PgColumnType(25, -1)
INT4 = PgColumnType(23, -1)


def _strings(values: list[str | None]) -> pa.Array:
    return pa.array(values, pa.large_string())


def test_unescape_decodes_every_output_escape() -> None:
    raw = _strings(
        ["plain", "a\\tb", "a\\nb\\rc", "\\\\", "\\\\t", "\\\\\\t", "\\b\\f\\v", "\\\\N", None, ""]
    )
    assert unescape(raw).to_pylist() == [
        "plain",
        "a\tb",
        "a\nb\rc",
        "\\",
        "\\t",
        "\\\t",
        "\b\f\v",
        "\\N",
        None,
        "",
    ]


def test_unescape_without_backslash_is_identity() -> None:
    raw = _strings(["a", None, ""])
    assert unescape(raw) is raw


def test_parse_copy_text_nulls_empty_strings_and_one_column_rows() -> None:
    cols = parse_copy_text(b"a\t\\N\n\t\n\\N\tx\\ty\n", 2)
    assert [c.to_pylist() for c in cols] == [["a", "", None], [None, "", "x\\ty"]]
    (single,) = parse_copy_text(b"\n\\N\nz\n", 1)
    assert single.to_pylist() == ["", None, "z"]


def test_chunk_to_table_fills_columns_the_copy_does_not_have() -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int32(), nullable=False),
            pa.field("gone", pa.large_string()),
            pa.field("v", pa.large_string()),
        ]
    )
    table = chunk_to_table(b"1\ta\\nb\n2\t\\N\n", (("id", INT4), ("v", TEXT)), schema)
    assert table.schema == schema
    assert table.to_pylist() == [
        {"id": 1, "gone": None, "v": "a\nb"},
        {"id": 2, "gone": None, "v": None},
    ]


# -- against the server ------------------------------------------------------------------

TRICKY = [
    "tab\there",
    "new\nline",
    "cr\rhere",
    "back\\slash",
    "\\N",
    "",
    "\\t literal",
    "ünïcödé ☃",
    "\b\f\v",
    "trailing backslash\\",
]


@pytest.mark.integration
def test_copy_text_round_trips_every_value_like_the_stream(pg_dsn: str) -> None:
    """COPY text, parsed and converted, equals the value's text output converted the
    way the stream converts it, for awkward strings, bytea, arrays, numbers, times."""
    with psycopg.connect(pg_dsn, autocommit=True, options=SESSION_OPTIONS) as conn:
        conn.execute(
            "CREATE TABLE w (id int, t text, b bytea, a text[], n numeric(12,3), "
            "f float8, ts timestamptz, j jsonb, u uuid)"
        )
        for i, s in enumerate(TRICKY):
            conn.execute(
                "INSERT INTO w VALUES (%s, %s, %s, %s, %s, 'NaN', "
                "'2024-02-29 12:00:00.123456+05:30', %s, gen_random_uuid())",
                (i, s, s.encode(), [s, None, "x,y", '"q"'], i * 1.5, f'{{"k": {i}}}'),
            )
        conn.execute("INSERT INTO w VALUES (99, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
        types = [
            (r[0], PgColumnType(int(r[1]), int(r[2])))
            for r in conn.execute(
                "SELECT attname, atttypid, atttypmod FROM pg_attribute "
                "WHERE attrelid = 'w'::regclass AND attnum > 0 ORDER BY attnum"
            )
        ]
        with conn.cursor().copy("COPY (SELECT * FROM w ORDER BY id) TO STDOUT") as copy:
            data = b"".join(bytes(row) for row in copy)
        texts = conn.execute(
            "SELECT " + ", ".join(f"{n}::text" for n, _ in types) + " FROM w ORDER BY id"
        ).fetchall()
    schema = pa.schema([pa.field(n, to_arrow(ct, []).type) for n, ct in types])
    got = chunk_to_table(data, tuple(types), schema)
    for ci, (name, ctype) in enumerate(types):
        want = to_arrow(ctype, [None if r[ci] is None else r[ci].encode() for r in texts])
        assert _same(got.column(name).to_pylist(), want.to_pylist()), name


def _same(a: list[Any], b: list[Any]) -> bool:
    # NaN is not equal to itself; compare it as a marker.
    def norm(v: Any) -> Any:
        return "NaN" if isinstance(v, float) and v != v else v

    return [norm(v) for v in a] == [norm(v) for v in b]


def _export(conn: psycopg.Connection[Any]) -> str:
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    row = conn.execute("SELECT pg_export_snapshot()").fetchone()
    assert row is not None
    return str(row[0])


def _task(pg_dsn: str, snapshot: str, tmp_path: Path, query: str) -> SliceTask:
    schema = pa.schema(
        [pa.field("id", pa.int32(), nullable=False), pa.field("v", pa.large_string())]
    )
    return SliceTask(
        table="public.s",
        target="public.s",
        slice_no=0,
        tag="sparkapply-copy test:0",
        conninfo=psycopg.conninfo.make_conninfo(pg_dsn, options=SESSION_OPTIONS),
        snapshot=snapshot,
        query=query,
        columns=(("id", INT4), ("v", TEXT)),
        schema=schema,
        data_dir=f"file://{tmp_path}/data",
        chunk_bytes=1000,  # several row groups
        storage=Storage(),
    )


@pytest.mark.integration
def test_slice_reads_as_of_the_snapshot(pg_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
        admin.execute("INSERT INTO s SELECT g, 'v' || g FROM generate_series(1, 2000) g")
        with psycopg.connect(pg_dsn, autocommit=True) as holder:
            snapshot = _export(holder)
            # After the snapshot: none of this may show up.
            admin.execute("INSERT INTO s VALUES (5000, 'late')")
            admin.execute("DELETE FROM s WHERE id <= 100")
            admin.execute("UPDATE s SET v = 'changed'")
            task = _task(pg_dsn, snapshot, tmp_path, "COPY (SELECT id, v FROM ONLY s) TO STDOUT")
            result = run_slice(task)
    assert result.error is None
    assert result.rows == 2000 and result.bytes > 0
    assert len(result.files) == 1 and result.files[0].startswith("file://")
    table = pq.read_table(result.files[0].removeprefix("file://"))
    assert pq.ParquetFile(result.files[0].removeprefix("file://")).num_row_groups > 1
    assert sorted(table.column("id").to_pylist()) == list(range(1, 2001))
    assert set(table.column("v").to_pylist()) == {f"v{i}" for i in range(1, 2001)}


@pytest.mark.integration
def test_slice_with_a_dead_snapshot_names_the_table_and_leaves_no_file(
    pg_dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
        with psycopg.connect(pg_dsn, autocommit=True) as holder:
            snapshot = _export(holder)
    result = run_slice(_task(pg_dsn, snapshot, tmp_path, "COPY s TO STDOUT"))
    assert isinstance(result.error, ConnectionLostError)  # a new session recovers
    assert result.error.context["table"] == "public.s"
    assert "snapshot" in str(result.error) and result.error.hint
    assert result.files == []
    assert not list((tmp_path / "data").glob("*.parquet"))


@pytest.mark.integration
def test_slice_sql_error_is_a_source_error(pg_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
        admin.execute("INSERT INTO s VALUES (1, 'a')")
        with psycopg.connect(pg_dsn, autocommit=True) as holder:
            snapshot = _export(holder)
            result = run_slice(
                _task(
                    pg_dsn, snapshot, tmp_path, "COPY (SELECT id, v FROM s WHERE 1/0 = 1) TO STDOUT"
                )
            )
    assert isinstance(result.error, SourceError)
    assert result.error.context["table"] == "public.s"
    assert "division by zero" in str(result.error)


@pytest.mark.integration
def test_a_table_renamed_before_its_slice_reads_it_is_a_transient_error(
    pg_dsn: str, tmp_path: Path
) -> None:
    """The copy names the table as its snapshot saw it; renamed since (name lookups see
    the catalog of now), the slice cannot find it. The next session copies what is
    published then, under the names it has then: a retry, not a stop."""
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE before_rename (id int PRIMARY KEY)")
        with psycopg.connect(pg_dsn, autocommit=True) as holder:
            snapshot = _export(holder)
            admin.execute("ALTER TABLE before_rename RENAME TO after_rename")
            query = "COPY (SELECT id FROM ONLY public.before_rename) TO STDOUT"
            result = run_slice(_task(pg_dsn, snapshot, tmp_path, query))
    assert isinstance(result.error, TableMovedError), result.error
    assert result.error.kind is ErrorKind.TRANSIENT
    assert result.error.context["table"] == "public.s" and not result.files
