"""The column types and the conversion call the value tests share.

The connection settings are the replication connection's: datestyle=ISO,
intervalstyle=postgres, extra_float_digits=3, UTF8, bytea_output=hex.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa

from sparkapply.convert.types import PgColumnType, column_target
from sparkapply.convert.values import to_arrow

UTC = dt.UTC

INT2, INT4, INT8, OID = (PgColumnType(o, -1) for o in (21, 23, 20, 26))
FLOAT4, FLOAT8 = PgColumnType(700, -1), PgColumnType(701, -1)
NUMERIC = PgColumnType(1700, -1)
BOOL, TEXT, BPCHAR, BYTEA = (PgColumnType(o, -1) for o in (16, 25, 1042, 17))
JSONB, INTERVAL, TIMETZ = (PgColumnType(o, -1) for o in (3802, 1186, 1266))
DATE, TIME, TIMESTAMP, TIMESTAMPTZ = (PgColumnType(o, -1) for o in (1082, 1083, 1114, 1184))
UUID = PgColumnType(2950, -1)
INT4_ARRAY, TEXT_ARRAY, INT8_ARRAY = (PgColumnType(o, -1) for o in (1007, 1009, 1016))

MAX_DATE = dt.date(9999, 12, 31)
MIN_DATE = dt.date(1, 1, 1)
MAX_TS = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
MIN_TS = dt.datetime(1, 1, 1)
MAX_18_4 = Decimal("99999999999999.9999")


def numeric(precision: int, scale: int) -> PgColumnType:
    return PgColumnType(1700, ((precision << 16) | (scale & 0x7FF)) + 4)


def convert(ctype: PgColumnType, *texts: str | None) -> list[object]:
    values = [None if t is None else t.encode() for t in texts]
    result = to_arrow(ctype, values)
    assert result.type == column_target(ctype).arrow_type
    assert len(result) == len(values)
    out: list[object] = result.to_pylist()
    return out


def micros(value: pa.Array) -> list[int | None]:
    """Timestamps as raw microseconds (to_pylist cannot show years beyond 9999)."""
    ints: list[int | None] = value.view(pa.int64()).to_pylist()
    return ints
