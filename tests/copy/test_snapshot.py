"""What to copy: catalog descriptions equal pgoutput's RELATION messages; slices; queries."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest

from sparkapply.copy.snapshot import (
    SPLIT_THRESHOLD,
    Slice,
    SourceTable,
    copy_query,
    describe_tables,
    plan_slices,
    published_tables,
)
from sparkapply.errors import PublicationError
from sparkapply.pgoutput import Decoder, Relation, RelationColumn


def _relations_from_pgoutput(conn: psycopg.Connection[Any], pub: str) -> dict[str, Relation]:
    """The RELATION messages pgoutput sends for one change to each published table."""
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_get_binary_changes('probe', NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s)",
        (pub,),
    ).fetchall()
    decoder = Decoder(1, False)
    out = {}
    for (data,) in rows:
        msg = decoder.decode(bytes(data))
        if isinstance(msg, Relation):
            out[f"{msg.namespace}.{msg.name}"] = msg
    return out


@pytest.mark.integration
def test_description_equals_the_relation_message(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            """
            CREATE SCHEMA "Odd schema";
            CREATE TABLE "Odd schema"."Mixed Case" (
                "Id" bigint, note varchar(20), n numeric(10,2), dropped int,
                g int GENERATED ALWAYS AS ("Id" * 2) STORED, ts timestamptz(3),
                PRIMARY KEY ("Id"));
            ALTER TABLE "Odd schema"."Mixed Case" DROP COLUMN dropped;
            CREATE TABLE full_ident (a int, b text[]);
            ALTER TABLE full_ident REPLICA IDENTITY FULL;
            CREATE TABLE by_index (a int NOT NULL, b int NOT NULL, c text);
            CREATE UNIQUE INDEX by_index_b ON by_index (b);
            ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_b;
            CREATE TABLE listed (id int PRIMARY KEY, secret text, shown text);
            CREATE PUBLICATION pub FOR TABLE "Odd schema"."Mixed Case", full_ident, by_index,
                listed (id, shown) WHERE (id > 10);
            """
        )
        conn.execute("SELECT pg_create_logical_replication_slot('probe', 'pgoutput')")
        # Decoding through SQL reads up to the flushed WAL only.
        conn.execute("SET synchronous_commit = on")
        conn.execute("""INSERT INTO "Odd schema"."Mixed Case" ("Id", note) VALUES (1, 'x')""")
        conn.execute("INSERT INTO full_ident VALUES (1, '{a}')")
        conn.execute("INSERT INTO by_index VALUES (1, 2, 'c')")
        conn.execute("INSERT INTO listed VALUES (11, 's', 'v')")
        sent = _relations_from_pgoutput(conn, "pub")
        described = {t.qualified: t for t in describe_tables(conn, ["pub"])}
        assert published_tables(conn, ["pub"]) == sorted(
            [
                ("Odd schema", "Mixed Case"),
                ("public", "by_index"),
                ("public", "full_ident"),
                ("public", "listed"),
            ]
        )
        conn.execute("SELECT pg_drop_replication_slot('probe')")
    assert set(described) == set(sent)
    for name, rel in sent.items():
        mine = described[name].relation
        assert (mine.namespace, mine.name, mine.replica_identity) == (
            rel.namespace,
            rel.name,
            rel.replica_identity,
        ), name
        assert mine.columns == rel.columns, name
        assert mine.relation_id == rel.relation_id
    assert described["public.listed"].row_filter == "(id > 10)"
    assert described["public.full_ident"].row_filter is None


@pytest.mark.integration
def test_row_filters_of_several_publications_are_ored(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            """
            CREATE TABLE t (id int PRIMARY KEY, v text);
            CREATE TABLE u (id int PRIMARY KEY, v text);
            CREATE PUBLICATION p1 FOR TABLE t WHERE (id < 5), u WHERE (id < 5);
            CREATE PUBLICATION p2 FOR TABLE t WHERE (id > 50), u;
            """
        )
        tables = {t.name: t for t in describe_tables(conn, ["p1", "p2"])}
        conn.execute("CREATE PUBLICATION p3 FOR TABLE t (id)")
        with pytest.raises(PublicationError, match="different column lists"):
            describe_tables(conn, ["p1", "p3"])
    assert tables["t"].row_filter in ("((id < 5)) OR ((id > 50))", "((id > 50)) OR ((id < 5))")
    assert tables["u"].row_filter is None  # one publication without a filter: every row


def _table(size: int, relkind: str = "r") -> SourceTable:
    return SourceTable(
        schema="s",
        name="t",
        oid=1,
        relkind=relkind,
        relation=Relation(None, 1, "s", "t", "d", ()),
        row_filter=None,
        size_bytes=size,
        block_size=8192,
        estimated_rows=-1,
    )


@pytest.mark.parametrize("pages", [1, 2, 7, 1000, 1024, 40_000, 100_003])
def test_slices_cover_every_block_once(pages: int) -> None:
    slices = plan_slices(_table(pages * 8192), slice_bytes=64 * 8192, parallelism=2)
    assert slices[0].first_block == 0 and slices[-1].end_block is None
    for a, b in itertools.pairwise(slices):
        assert a.end_block == b.first_block
    assert len(slices) <= pages
    if pages * 8192 >= SPLIT_THRESHOLD:
        assert len(slices) >= 4


def test_no_slices_for_an_empty_table_one_for_a_partitioned_root() -> None:
    assert plan_slices(_table(0)) == []
    assert plan_slices(_table(10 * 8192, "p")) == [Slice(0, None)]
    assert plan_slices(_table(0, "p")) == []


def test_copy_query_quotes_names_and_adds_slice_and_filter() -> None:
    t = SourceTable(
        schema='we"ird',
        name="Tab le",
        oid=1,
        relkind="r",
        relation=Relation(
            None,
            1,
            'we"ird',
            "Tab le",
            "d",
            (RelationColumn(1, "Id", 23, -1),),
        ),
        row_filter='("Id" > 3)',
        size_bytes=8192,
        block_size=8192,
        estimated_rows=1,
    )
    assert copy_query(t, Slice(10, 20)) == (
        'COPY (SELECT "Id" FROM ONLY "we""ird"."Tab le" WHERE ctid >= \'(10,0)\'::tid '
        "AND ctid < '(20,0)'::tid AND ((\"Id\" > 3))) TO STDOUT"
    )
    assert copy_query(t, Slice(0, None)) == (
        'COPY (SELECT "Id" FROM ONLY "we""ird"."Tab le" WHERE (("Id" > 3))) TO STDOUT'
    )
