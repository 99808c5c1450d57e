"""Helpers of the golden tests: decoding captured pgoutput and reading what the
workload knows from the server."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg

from sparkapply.pgoutput import Decoder
from sparkapply.pgoutput import messages as m
from tests.pgoutput.capture import Captured

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
INT4, INT8, TEXT, VARCHAR, NUMERIC, TIMESTAMPTZ = 23, 20, 25, 1043, 1700, 1184
T = TypeVar("T")


def decode(
    records: Sequence[Captured], streaming: str = "parallel", proto_version: int = 4
) -> list[m.Message]:
    """Decode in order with one Decoder, as one replication session would."""
    dec = Decoder(proto_version=proto_version, streaming=streaming)
    return [dec.decode(r.payload) for r in records]


def of(msgs: Sequence[m.Message], cls: type[T]) -> list[T]:
    return [x for x in msgs if isinstance(x, cls)]


def one(msgs: Sequence[m.Message], cls: type[T]) -> T:
    found = of(msgs, cls)
    assert len(found) == 1, f"expected one {cls.__name__}, got {len(found)}: {found}"
    return found[0]


def kinds(msgs: Sequence[m.Message]) -> list[str]:
    return [type(x).__name__ for x in msgs]


def server_clock(conn: psycopg.Connection[Any]) -> int:
    """The server's clock now, in microseconds since the PostgreSQL epoch."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return int((row[0] - PG_EPOCH) / timedelta(microseconds=1))


def oid(conn: psycopg.Connection[Any], expr: str) -> int:
    row = conn.execute(f"SELECT {expr}::oid::bigint").fetchone()
    assert row is not None
    return int(row[0])


def tup(*values: bytes | None, kinds: bytes | None = None) -> m.TupleData:
    """Expected TupleData: text values, ``None`` for NULL (or ``kinds`` given; a 'u'
    column's value is UNCHANGED)."""
    if kinds is None:
        kinds = bytes(m.KIND_NULL if v is None else m.KIND_TEXT for v in values)
    return m.TupleData(
        kinds,
        tuple(
            m.UNCHANGED if k == m.KIND_UNCHANGED else v for k, v in zip(kinds, values, strict=True)
        ),
    )


def split_transactions(msgs: Sequence[m.Message]) -> Iterator[list[m.Message]]:
    """Begin..Commit and BeginPrepare..Prepare groups, in order."""
    cur: list[m.Message] | None = None
    for x in msgs:
        if isinstance(x, m.Begin | m.BeginPrepare):
            assert cur is None, "transaction started inside a transaction"
            cur = [x]
        elif cur is not None:
            cur.append(x)
            if isinstance(x, m.Commit | m.Prepare):
                yield cur
                cur = None
    assert cur is None, "unterminated transaction"


def stream_segments(msgs: Sequence[m.Message]) -> list[list[m.Message]]:
    """Stream Start .. Stream Stop groups, each including both ends."""
    segs: list[list[m.Message]] = []
    cur: list[m.Message] | None = None
    for x in msgs:
        if isinstance(x, m.StreamStart):
            assert cur is None, "Stream Start inside a stream segment"
            cur = [x]
        elif cur is not None:
            cur.append(x)
            if isinstance(x, m.StreamStop):
                segs.append(cur)
                cur = None
    assert cur is None, "unterminated stream segment"
    return segs
