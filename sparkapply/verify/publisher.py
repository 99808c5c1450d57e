"""The publisher's side of ``verify``: one exact point, and each table hashed there.

A temporary logical slot exports a snapshot at its consistent point C: it sees exactly
the transactions committed before C. A repeatable-read transaction imports it, and
every published table is read in it (its published columns, its row filter, as the
initial copy reads it), hashed by the server per bucket (``canonical.py``). The
slot is temporary: the server drops it when the replication connection closes, also
when ``verify`` is killed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from sparkapply.config import Config
from sparkapply.copy.snapshot import SourceTable, begin_at_snapshot
from sparkapply.errors import SourceError
from sparkapply.lsn import Lsn
from sparkapply.source.connection import connect
from sparkapply.source.publisher import temporary_snapshot
from sparkapply.verify.canonical import (
    HASH_MOD,
    sql_bucket,
    sql_hash,
    sql_hash_bucket,
    sql_row_text,
    sql_text,
    text_hash,
)
from sparkapply.verify.mirror import Buckets, RowTexts, Shape


@dataclass(frozen=True, slots=True)
class ExactPoint:
    lsn: Lsn  # the slot's consistent point: the snapshot holds exactly what precedes it
    conn: psycopg.Connection[Any]  # in a transaction that sees the snapshot

    @property
    def cut_lsn(self) -> Lsn:
        """The mirror's cut holding exactly what the snapshot sees: every commit below
        the point, the stamp a copy at the same kind of point gets (``copy/driver.py``,
        THE HAND-OVER). A cut at the point itself holds one transaction too many when
        a commit record starts right at it (the snapshot does not see that commit, a
        cut "at or below" the point applies it): verify then named a row that a
        prepared transaction, committed at that instant, had changed."""
        return Lsn(self.lsn - 1)


@contextlib.contextmanager
def exact_point(
    config: Config, *, before: Callable[[Lsn], None] | None = None
) -> Iterator[ExactPoint]:
    """A connection reading the publisher exactly at a fresh slot's consistent point;
    ``before`` is given the publisher's WAL position before the slot is created."""
    src = config.source
    with temporary_snapshot(src, "verify", "verify", before=before) as (snapshot, point):
        conn = connect(
            src.dsn,
            application_name="sparkapply verify",
            autocommit=False,
            connect_timeout=src.connect_timeout,
        )
        try:
            begin_at_snapshot(conn, snapshot)
        except BaseException:
            conn.close()
            raise
    # The imported snapshot outlives the slot, which is gone now.
    try:
        yield ExactPoint(point, conn)
    finally:
        conn.close()


# Longer than lookup3's 12-byte block, with a multibyte character and a separator;
# for a server encoding other than UTF-8, what every encoding can spell.
_PROBE = "sparkapply verify\x1fprobe \u00e9\u20ac"
_ASCII_PROBE = "sparkapply verify\x1fprobe 0123456789"


def server_utf8(conn: psycopg.Connection[Any]) -> bool:
    """Whether the database's encoding is UTF-8 (see :func:`sql_hash`); refuses one
    that verify cannot hash as the mirror holds it."""
    encoding = conn.info.parameter_status("server_encoding") or "UTF8"
    if encoding == "UTF8":
        return True
    row = conn.execute(
        "SELECT pg_catalog.pg_encoding_max_length(pg_catalog.pg_char_to_encoding(%s))",
        (encoding,),
    ).fetchone()
    if row is None or row[0] != 1:
        raise SourceError(
            f"verify cannot hash rows of a database in the multibyte encoding {encoding}",
            hint="verify supports databases in UTF8 and in single-byte encodings (LATIN1, "
            "WIN1252, SQL_ASCII...); the mirror itself is not affected",
        )
    return False


def check_hash(conn: psycopg.Connection[Any]) -> None:
    """Stop unless the server hashes a row's text as the mirror's side does (a
    big-endian server does not), before a whole table is hashed for nothing."""
    utf8 = server_utf8(conn)
    probe = _PROBE if utf8 else _ASCII_PROBE
    query = sql.SQL("SELECT {}").format(sql_hash(sql.Literal(probe), utf8=utf8))
    row = conn.execute(query).fetchone()
    theirs = None if row is None else row[0]
    if theirs != text_hash(probe):
        raise SourceError(
            "the publisher's hashtextextended differs from the one verify computes over"
            f" the mirror ({theirs} against {text_hash(probe)})",
            hint="verify needs a little-endian publisher (x86-64, arm64)",
        )


def _source(table: SourceTable) -> sql.Composable:
    only = sql.SQL("") if table.relkind == "p" else sql.SQL("ONLY ")
    return sql.SQL("{}{}").format(only, sql.Identifier(table.schema, table.name))


def _texts(shape: Shape) -> tuple[list[sql.Composable], sql.Composable, sql.Composable]:
    cols = [sql_text(sql.Identifier(name), target) for name, target in shape.columns]
    row = sql_row_text(cols)
    names = [name for name, _ in shape.columns]
    key = sql_row_text([cols[names.index(k)] for k in shape.key]) if shape.key else row
    return cols, row, key


def _where(table: SourceTable) -> sql.Composable:
    return (
        sql.SQL(" WHERE ({})").format(sql.SQL(table.row_filter))
        if table.row_filter
        else sql.SQL("")
    )


def publisher_sums(conn: psycopg.Connection[Any], table: SourceTable, shape: Shape) -> Buckets:
    """Rows and hash sums per bucket, computed by the server."""
    _, row, _ = _texts(shape)
    hash_ = sql.Identifier("h")
    # OFFSET 0 keeps the subquery whole: flattened, the hash's expression would be
    # computed twice a row (once for the bucket, once for the sum), and the planner,
    # blind to how few buckets there are, sorts the table to group it.
    query = sql.SQL(
        "SELECT {bucket}, count(*), sum({h}) FROM (SELECT {hash} AS h "
        "FROM {source}{where} OFFSET 0) s GROUP BY 1"
    ).format(
        bucket=sql_hash_bucket(hash_, shape.buckets),
        h=hash_,
        hash=sql_hash(row, utf8=server_utf8(conn)),
        source=_source(table),
        where=_where(table),
    )
    return {int(b): (int(n), int(h) % HASH_MOD) for b, n, h in conn.execute(query)}


def publisher_rows(
    conn: psycopg.Connection[Any], table: SourceTable, shape: Shape, wanted: Sequence[int]
) -> list[RowTexts]:
    """The rows that fall in ``wanted`` buckets, with their texts."""
    cols, row, key = _texts(shape)
    bucket = sql_bucket(row, shape.buckets, utf8=server_utf8(conn))
    where = _where(table)
    joiner = sql.SQL(" AND ") if table.row_filter else sql.SQL(" WHERE ")
    query = sql.SQL(
        "SELECT {key}, {row}, {cols} FROM {source}{where}{joiner}{bucket} = ANY({wanted})"
    ).format(
        key=key,
        row=row,
        cols=sql.SQL(", ").join(cols),
        source=_source(table),
        where=where,
        joiner=joiner,
        bucket=bucket,
        # Inlined, not a parameter: the texts use format('%s', ...).
        wanted=sql.Literal([int(b) for b in wanted]),
    )
    return [RowTexts(r[0], r[1], tuple(r[2:])) for r in conn.execute(query)]


def total(buckets: Buckets) -> tuple[int, int]:
    """(rows, hash mod 2^64) of a table from its buckets."""
    return sum(n for n, _ in buckets.values()), sum(h for _, h in buckets.values()) % HASH_MOD
