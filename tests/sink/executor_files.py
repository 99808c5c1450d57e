"""Parquet files as sparkapply's executors wrote them before they wrote field ids: plain
pyarrow, columns named and typed like the Iceberg table, key columns non-nullable. The
table's name mapping resolves them, so the sink's tests keep such files readable."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Table

from sparkapply.datafiles import data_directory

UTC = dt.UTC

# The Arrow types of the `orders` test table (see conftest.orders_schema).
ORDERS_ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("amount", pa.decimal128(12, 2)),
        pa.field("placed_at", pa.timestamp("us", tz="UTC")),
        pa.field("ref", pa.uuid()),
        pa.field("at", pa.time64("us")),
        pa.field("qty", pa.int32()),
        pa.field("note", pa.string()),
    ]
)


def order(i: int, *, note: str | None = None) -> dict[str, Any]:
    """One deterministic row of the orders table."""
    return {
        "id": i,
        "amount": decimal.Decimal(f"{i}.{i % 100:02d}"),
        "placed_at": dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=i),
        "ref": uuid.UUID(int=i).bytes,
        "at": dt.time(12, 0, i % 60),
        "qty": i * 10,
        "note": note if note is not None else f"order {i}",
    }


def to_arrow(rows: Sequence[dict[str, Any]], schema: pa.Schema = ORDERS_ARROW) -> pa.Table:
    columns = {}
    for field in schema:
        values = [r.get(field.name) for r in rows]
        if isinstance(field.type, pa.UuidType):
            columns[field.name] = pa.array(values, pa.binary(16)).cast(field.type)
        else:
            columns[field.name] = pa.array(values, field.type)
    return pa.Table.from_pydict(columns, schema=schema)


def write_data_file(table: Table, data: pa.Table) -> str:
    """Write ``data`` as a new Parquet file in the table's data directory; its URI."""
    path = f"{data_directory(table)}/{uuid.uuid4()}.parquet"
    pq.write_table(data, path)
    return path


def write_orders(table: Table, ids: Sequence[int], *, note: str | None = None) -> str:
    return write_data_file(table, to_arrow([order(i, note=note) for i in ids]))
