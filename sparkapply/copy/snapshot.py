"""What to copy: the published tables as the catalog describes them, and their slices.

A table is described the way pgoutput's RELATION message would describe it (published
columns in attribute order, type OID and modifier, key flags from the replica
identity), so :func:`sparkapply.convert.schema.iceberg_schema_for` builds the same
Iceberg schema the stream would, and later RELATION messages find nothing to evolve.
One difference: a column declared with more than one dimension (``int4[][]``) is
described as ``text``, which the stream's RELATION cannot say (see
``convert/types.py``, ARRAYS OF MORE THAN ONE DIMENSION).

Run :func:`describe_tables` inside a transaction that has imported the copy's snapshot:
plain catalog reads (``pg_attribute``) then show the columns as of the snapshot. The
publication's membership, column lists and row filters come from
``pg_publication_tables``, as PostgreSQL's own table synchronisation reads them.

A slice is a range of heap blocks, read with a TID range scan
(``ctid >= '(b1,0)' AND ctid < '(b2,0)'``, PostgreSQL 14+). The last slice has no upper
bound, so rows on blocks added after the size was read are still covered (they are
invisible to the snapshot anyway, but the bound costs nothing).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from sparkapply.convert.types import PgColumnType, columns_as_text
from sparkapply.errors import PublicationError
from sparkapply.pgoutput.messages import Relation, RelationColumn
from sparkapply.source.publisher import publication_rows

DEFAULT_SLICE_BYTES = 64 * 1024 * 1024
"""Heap bytes per slice: one Spark task, one Parquet data file."""

SPLIT_THRESHOLD = 8 * 1024 * 1024
"""Tables at least this big are cut into at least two slices per Spark core."""

_TABLES_SQL = """
SELECT n.nspname, c.relname, c.oid, c.relkind, c.relreplident, {attnames}, {rowfilter},
       CASE WHEN c.relkind = 'p'
            THEN (SELECT coalesce(sum(pg_relation_size(t.relid)), 0)
                  FROM pg_partition_tree(c.oid) t)
            ELSE pg_relation_size(c.oid) END,
       CASE WHEN c.relkind = 'p'
            THEN (SELECT coalesce(sum(greatest(k.reltuples, 0)), 0)
                  FROM pg_partition_tree(c.oid) t JOIN pg_class k ON k.oid = t.relid)
            ELSE c.reltuples END,
       c.relnatts
FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = ANY(%s)
ORDER BY 1, 2
"""

_COLUMNS_SQL = """
SELECT a.attrelid, a.attname, a.atttypid, a.atttypmod,
       coalesce(a.attnum = ANY(i.indkey::int2[]), false), a.attgenerated <> '', a.attndims,
       a.attnum
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_index i ON i.indrelid = a.attrelid
     AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))
WHERE a.attrelid = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""


@dataclass(frozen=True, slots=True)
class SourceTable:
    """One published table as the copy sees it."""

    schema: str
    name: str
    oid: int
    relkind: str  # 'r' table, 'p' partitioned table (publish_via_partition_root)
    relation: Relation  # what pgoutput's RELATION message would say
    row_filter: str | None  # the publication's WHERE expression (ORed across publications)
    size_bytes: int  # heap size (all partitions for 'p')
    block_size: int
    estimated_rows: int  # pg_class.reltuples; -1 when never analysed
    # pg_class.relnatts: the highest column number the table has ever given, dropped
    # columns included; every column numbered above it was added after this look.
    last_attnum: int = 0
    column_numbers: tuple[tuple[str, int], ...] = ()  # (name, attnum) of each published

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def key(self) -> tuple[str, str]:
        return (self.schema, self.name)

    @property
    def columns(self) -> tuple[tuple[str, PgColumnType], ...]:
        return tuple(
            (c.name, PgColumnType(c.type_oid, c.type_modifier)) for c in self.relation.columns
        )

    @property
    def pages(self) -> int:
        return self.size_bytes // self.block_size


@dataclass(frozen=True, slots=True)
class Slice:
    """Heap blocks ``[first_block, end_block)``; ``end_block`` None = to the end."""

    first_block: int
    end_block: int | None

    @property
    def whole_table(self) -> bool:
        return self.first_block == 0 and self.end_block is None


def published_tables(
    conn: psycopg.Connection[Any], publications: Sequence[str]
) -> list[tuple[str, str]]:
    """``(schema, table)`` of every table the publications publish, sorted."""
    rows = publication_rows(
        conn,
        "SELECT DISTINCT schemaname, tablename FROM pg_publication_tables "
        "WHERE pubname = ANY(%s) ORDER BY 1, 2",
        (list(publications),),
    )
    return [(str(s), str(t)) for s, t in rows]


def describe_tables(
    conn: psycopg.Connection[Any],
    publications: Sequence[str],
    only: Collection[tuple[str, str]] | None = None,
) -> list[SourceTable]:
    """The published tables (or those of ``only`` that are published), described.

    Raises :class:`PublicationError` for a table that two publications publish with
    different column lists (PostgreSQL's subscriber refuses that too).
    """
    modern = conn.info.server_version >= 150000  # column lists and row filters
    query = _TABLES_SQL.format(
        attnames="pt.attnames" if modern else "NULL::name[]",
        rowfilter="pt.rowfilter" if modern else "NULL::text",
    )
    block_row = conn.execute("SELECT current_setting('block_size')::int").fetchone()
    block_size = int(block_row[0]) if block_row else 8192
    wanted = set(only) if only is not None else None
    grouped: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in publication_rows(conn, query, (list(publications),)):
        key = (str(row[0]), str(row[1]))
        if wanted is None or key in wanted:
            grouped.setdefault(key, []).append(tuple(row))
    if not grouped:
        return []
    oids = [int(rows[0][2]) for rows in grouped.values()]
    columns: dict[int, list[tuple[str, int, int, bool, bool, int]]] = {}
    multidimensional: dict[int, set[str]] = {}
    for relid, attname, typid, typmod, is_key, generated, ndims, attnum in conn.execute(
        _COLUMNS_SQL, (oids,)
    ).fetchall():
        columns.setdefault(int(relid), []).append(
            (str(attname), int(typid), int(typmod), bool(is_key), bool(generated), int(attnum))
        )
        if ndims > 1:
            multidimensional.setdefault(int(relid), set()).add(str(attname))
    # pgoutput publishes a generated column from PostgreSQL 18 on only (and then as
    # pg_publication_tables says); PostgreSQL 15's view lists them all the same.
    generated_ok = conn.info.server_version >= 180000
    described = [
        _describe(key, rows, columns.get(int(rows[0][2]), []), block_size, generated_ok)
        for key, rows in grouped.items()
    ]
    # Mirrored as text (convert/types.py, ARRAYS OF MORE THAN ONE DIMENSION).
    return [
        dataclasses.replace(
            t, relation=columns_as_text(t.relation, multidimensional.get(t.oid, set()))
        )
        for t in described
    ]


def _describe(
    key: tuple[str, str],
    rows: list[tuple[Any, ...]],
    attributes: list[tuple[str, int, int, bool, bool, int]],
    block_size: int,
    generated_ok: bool = True,
) -> SourceTable:
    schema, name = key
    _, _, oid, relkind, replident, _, _, size, reltuples, last_attnum = rows[0]
    lists = {tuple(r[5]) if r[5] is not None else None for r in rows}
    if len(lists) > 1:
        raise PublicationError(
            f"table {schema}.{name} is published with different column lists by the "
            "configured publications",
            relation=f"{schema}.{name}",
            hint="give the table the same column list in every publication of [source] "
            "publication, or subscribe to one of them",
        )
    column_list = next(iter(lists))
    full = replident == "f"
    published = set(column_list) if column_list is not None else None
    # Generated columns are published only when the column list names them
    # (PostgreSQL 18: publish_generated_columns = stored, or an explicit list).
    chosen = [
        a
        for a in attributes
        if (a[0] in published if published is not None else not a[4]) and (generated_ok or not a[4])
    ]
    cols = tuple(
        RelationColumn(1 if (full or is_key) else 0, attname, typid, typmod)
        for attname, typid, typmod, is_key, _, _ in chosen
    )
    return SourceTable(
        schema=schema,
        name=name,
        oid=int(oid),
        relkind=str(relkind),
        relation=Relation(None, int(oid), schema, name, str(replident), cols),
        row_filter=_row_filter([r[6] for r in rows]),
        size_bytes=int(size),
        block_size=block_size,
        estimated_rows=int(reltuples) if float(reltuples) >= 0 else -1,
        last_attnum=int(last_attnum),
        column_numbers=tuple((a[0], a[5]) for a in chosen),
    )


def multidimensional_columns(
    conn: psycopg.Connection[Any], relation_oid: int, names: Collection[str]
) -> set[str]:
    """The columns of ``names`` the relation declares with more than one dimension
    (see ``convert/types.py``, ARRAYS OF MORE THAN ONE DIMENSION)."""
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attname = ANY(%s) "
        "AND attndims > 1 AND NOT attisdropped",
        (relation_oid, list(names)),
    ).fetchall()
    return {str(r[0]) for r in rows}


def _row_filter(filters: list[Any]) -> str | None:
    """One table's row filters, one per publication (None: that one has none)."""
    # As PostgreSQL's table synchronisation: a publication without a filter wins,
    # otherwise a row is copied when any publication's filter accepts it.
    distinct = list(dict.fromkeys(filters))
    if any(f is None for f in distinct):
        return None
    if len(distinct) == 1:
        return str(distinct[0])
    return " OR ".join(f"({f})" for f in distinct)


def plan_slices(
    table: SourceTable,
    *,
    slice_bytes: int = DEFAULT_SLICE_BYTES,
    parallelism: int = 2,
) -> list[Slice]:
    """Cut a table into block ranges of about ``slice_bytes`` (at least two per core
    for a table of :data:`SPLIT_THRESHOLD` or more). Empty tables get no slice;
    partitioned tables one whole-table slice."""
    if table.relkind == "p":
        return [Slice(0, None)] if table.size_bytes else []
    pages = table.pages
    if pages == 0:
        # Measured after the snapshot was taken: a row the snapshot sees was inserted
        # before it, and its block cannot be truncated away while the snapshot holds
        # back vacuum. No blocks, no visible rows.
        return []
    count = math.ceil(table.size_bytes / max(1, slice_bytes))
    if table.size_bytes >= SPLIT_THRESHOLD:
        count = max(count, 2 * max(1, parallelism))
    count = max(1, min(count, pages))
    per = math.ceil(pages / count)
    slices = [Slice(b, b + per) for b in range(0, pages, per)]
    last = slices[-1]
    slices[-1] = Slice(last.first_block, None)
    return slices


def begin_at_snapshot(conn: psycopg.Connection[Any], snapshot: str) -> None:
    """Start a read-only repeatable-read transaction that sees the exported ``snapshot``."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))


def copy_query(table: SourceTable, piece: Slice) -> str:
    """``COPY (SELECT <published columns> FROM t WHERE <slice> AND <row filter>) TO STDOUT``."""
    cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.relation.columns).as_string()
    # ONLY: inheritance children are published (and copied) as tables of their own.
    only = "" if table.relkind == "p" else "ONLY "
    source = only + sql.Identifier(table.schema, table.name).as_string()
    where = []
    if piece.first_block > 0:
        where.append(f"ctid >= '({piece.first_block},0)'::tid")
    if piece.end_block is not None:
        where.append(f"ctid < '({piece.end_block},0)'::tid")
    if table.row_filter is not None:
        where.append(f"({table.row_filter})")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"COPY (SELECT {cols} FROM {source}{clause}) TO STDOUT"
