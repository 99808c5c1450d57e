"""Fixtures: a real pyiceberg SQLite catalog in a temporary directory (no mocks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    DecimalType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from sparkapply.sink import ensure_table, open_catalog

ORDERS = ("public", "orders")


def orders_schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "amount", DecimalType(12, 2)),
        NestedField(3, "placed_at", TimestamptzType()),
        NestedField(4, "ref", UUIDType()),
        NestedField(5, "at", TimeType()),
        NestedField(6, "qty", IntegerType()),
        NestedField(7, "note", StringType()),
        identifier_field_ids=[1],
    )


@pytest.fixture
def catalog_properties(tmp_path: Path) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog/catalog.db",
        "warehouse": str(tmp_path / "warehouse"),
    }


@pytest.fixture
def catalog(catalog_properties: dict[str, str]) -> Catalog:
    return open_catalog("test", catalog_properties)


@pytest.fixture
def orders(catalog: Catalog) -> Table:
    return ensure_table(catalog, ORDERS, orders_schema())
