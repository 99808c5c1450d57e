"""The test harness's Java Iceberg reader (:mod:`tests.java_reader`): what it cannot
read is Spark's limit, checked so that the exclusion goes when the limit does."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, TimeType

from tests.java_reader import shared_java_reader, spark_unreadable
from tests.readers import can_read


def test_spark_cannot_read_a_table_with_a_time_column(catalog: Catalog) -> None:
    catalog.create_namespace_if_not_exists("public")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "at", TimeType()),
    )
    table = catalog.create_table(("public", "clock"), schema)
    table.append(
        pa.table(
            {"id": pa.array([1], pa.int64()), "at": pa.array([dt.time(12, 30)], pa.time64("us"))},
            schema=pa.schema([pa.field("id", pa.int64(), False), pa.field("at", pa.time64("us"))]),
        )
    )
    # Not even the other column: the whole table is left out of Java's comparisons.
    assert spark_unreadable(table) == ["id", "at"]
    assert not can_read("java", table)
    with pytest.raises(AssertionError, match="Spark does not support time fields"):
        shared_java_reader().read(table, ["id"])
