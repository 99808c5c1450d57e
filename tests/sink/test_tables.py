from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    StringType,
)

from sparkapply.datafiles import arrow_schema_of
from sparkapply.errors import SchemaChangeError, SinkError
from sparkapply.location import path_segment
from sparkapply.lsn import Lsn
from sparkapply.sink import apply_evolution, commit_files, ensure_table, read_table
from sparkapply.sink.tables import NAME_MAPPING_PROPERTY, replace_columns

from .conftest import ORDERS, orders_schema
from .executor_files import ORDERS_ARROW, order, to_arrow, write_data_file, write_orders


def mapping_names(table: Table) -> dict[str, int]:
    entries = json.loads(table.properties[NAME_MAPPING_PROPERTY])
    return {name: e["field-id"] for e in entries for name in e["names"]}


def test_ensure_table_creates_namespace_table_and_mapping(catalog: Catalog, orders: Table) -> None:
    assert ("public",) in catalog.list_namespaces()
    assert orders.metadata.format_version == 2
    assert orders.schema().identifier_field_names() == {"id"}
    assert mapping_names(orders) == {f.name: f.field_id for f in orders.schema().fields}
    assert orders.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert orders.current_snapshot() is None


def test_ensure_table_is_idempotent_and_keeps_properties(catalog: Catalog, orders: Table) -> None:
    again = ensure_table(catalog, ORDERS, orders_schema(), properties={"x": "y"})
    assert again.metadata.table_uuid == orders.metadata.table_uuid
    assert "x" not in again.properties  # an existing table is not altered


def test_ensure_table_properties_override_defaults(catalog: Catalog) -> None:
    table = ensure_table(
        catalog, ("s", "t"), orders_schema(), properties={"commit.manifest-merge.enabled": "false"}
    )
    assert table.properties["commit.manifest-merge.enabled"] == "false"


def test_ensure_table_repairs_a_missing_name_mapping(catalog: Catalog, orders: Table) -> None:
    with orders.transaction() as txn:
        txn.remove_properties(NAME_MAPPING_PROPERTY)
    assert catalog.load_table(ORDERS).name_mapping() is None
    repaired = ensure_table(catalog, ORDERS, orders_schema())
    assert mapping_names(repaired) == {f.name: f.field_id for f in repaired.schema().fields}


def test_added_column_reads_null_in_old_files_and_values_in_new(orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1, 2])], lsn=Lsn("0/10"))

    assert apply_evolution(orders, add_columns=[("status", StringType())], lsn=Lsn("0/11"))
    assert "status" in mapping_names(orders)
    assert orders.schema().find_field("status").optional

    schema = ORDERS_ARROW.append(pa.field("status", pa.string()))
    rows = [dict(order(3), status="shipped")]
    commit_files(orders, added=[write_data_file(orders, to_arrow(rows, schema))], lsn=Lsn("0/12"))

    result = read_table(orders).sort_by("id")
    assert result.column("status").to_pylist() == [None, None, "shipped"]
    assert result.column("id").to_pylist() == [1, 2, 3]


def test_widened_column_reads_old_and_new_files(catalog: Catalog, orders: Table) -> None:
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    assert apply_evolution(orders, widen=[("qty", LongType())])
    assert orders.schema().find_field("qty").field_type == LongType()

    schema = ORDERS_ARROW.set(ORDERS_ARROW.get_field_index("qty"), pa.field("qty", pa.int64()))
    big = dict(order(2), qty=2**40)
    commit_files(orders, added=[write_data_file(orders, to_arrow([big], schema))], lsn=Lsn("0/20"))

    result = read_table(catalog.load_table(ORDERS)).sort_by("id")
    assert result.schema.field("qty").type == pa.int64()
    assert result.column("qty").to_pylist() == [10, 2**40]


def test_evolution_is_idempotent(orders: Table) -> None:
    add: list[tuple[str, IcebergType]] = [("status", StringType())]
    widen: list[tuple[str, IcebergType]] = [("qty", LongType())]
    assert apply_evolution(orders, add_columns=add, widen=widen)
    schema_id = orders.schema().schema_id
    assert not apply_evolution(orders, add_columns=add, widen=widen)
    # A replayed older RELATION (int again) against the widened table is a no-op too.
    assert not apply_evolution(orders, widen=[("qty", IntegerType())])
    assert orders.schema().schema_id == schema_id


def test_add_of_an_existing_column_with_a_wider_type_widens(orders: Table) -> None:
    assert apply_evolution(orders, add_columns=[("qty", LongType())])
    assert orders.schema().find_field("qty").field_type == LongType()


@pytest.mark.parametrize(
    ("column", "new_type"),
    [
        ("note", IntegerType()),
        ("amount", DecimalType(12, 3)),  # scale change (pyiceberg's promote lets it pass)
        ("amount", DoubleType()),
        ("qty", FloatType()),
        ("placed_at", StringType()),
    ],
)
def test_unsupported_type_change_names_table_column_types_and_lsn(
    orders: Table, column: str, new_type: DecimalType
) -> None:
    old_type = orders.schema().find_field(column).field_type
    with pytest.raises(SchemaChangeError) as info:
        apply_evolution(orders, widen=[(column, new_type)], lsn=Lsn("1/A0"))
    err = info.value
    assert err.context == {"table": "public.orders", "column": column, "lsn": Lsn("1/A0")}
    assert str(old_type) in err.message and str(new_type) in err.message
    assert "1/A0" in str(err)
    assert orders.schema().find_field(column).field_type == old_type


def test_narrowing_of_a_widened_column_is_a_no_op(orders: Table) -> None:
    # PostgreSQL can narrow numeric(12,2) to numeric(10,2); every new value still fits.
    assert not apply_evolution(orders, widen=[("amount", DecimalType(10, 2))])
    assert orders.schema().find_field("amount").field_type == DecimalType(12, 2)


def test_widen_of_a_missing_column_fails(orders: Table) -> None:
    with pytest.raises(SchemaChangeError, match="does not have"):
        apply_evolution(orders, widen=[("nope", LongType())])


def test_float_to_double_and_decimal_precision(orders: Table) -> None:
    apply_evolution(orders, add_columns=[("f", FloatType())])
    assert apply_evolution(orders, widen=[("f", DoubleType()), ("amount", DecimalType(20, 2))])
    schema = orders.schema()
    assert schema.find_field("f").field_type == DoubleType()
    assert schema.find_field("amount").field_type == DecimalType(20, 2)


def test_list_element_widening(orders: Table) -> None:
    apply_evolution(orders, add_columns=[("tags", ListType(100, IntegerType()))])
    assert apply_evolution(orders, widen=[("tags", ListType(101, LongType()))])
    tags = orders.schema().find_field("tags").field_type
    assert isinstance(tags, ListType) and tags.element_type == LongType()


def test_identifier_fields(orders: Table) -> None:
    apply_evolution(orders, identifier_fields=[])
    assert orders.schema().identifier_field_names() == set()
    apply_evolution(orders, identifier_fields=["id"])
    assert orders.schema().identifier_field_names() == {"id"}


def test_a_key_iceberg_cannot_hold_clears_the_identifier_and_never_stops(
    orders: Table,
) -> None:
    """Identifier fields are advisory: a key on an optional or a new column clears
    them (old rows may hold nulls there), and the schema change itself goes through."""
    assert apply_evolution(orders, identifier_fields=["id", "note"])
    assert orders.schema().identifier_field_names() == set()
    assert orders.schema().find_field("id").required  # still required: never null
    assert not apply_evolution(orders, identifier_fields=["note"])  # nothing to clear
    assert apply_evolution(orders, add_columns=[("k", LongType())], identifier_fields=["k"])
    assert "k" in {f.name for f in orders.schema().fields}
    assert orders.schema().identifier_field_names() == set()


def test_a_column_that_leaves_the_key_becomes_optional(orders: Table) -> None:
    """The old key column may be dropped on the publisher: its new rows hold null."""
    assert apply_evolution(orders, identifier_fields=[], make_optional=["id"])
    assert not orders.schema().find_field("id").required
    assert orders.schema().identifier_field_names() == set()
    assert not apply_evolution(orders, make_optional=["id"])  # idempotent


def test_evolution_gives_a_table_without_mapping_a_complete_one(
    catalog: Catalog, orders: Table
) -> None:
    # A table created by another tool may lack the mapping; the schema change adds it.
    with orders.transaction() as txn:
        txn.remove_properties(NAME_MAPPING_PROPERTY)
    table = catalog.load_table(ORDERS)
    assert apply_evolution(table, add_columns=[("status", StringType())])
    assert mapping_names(table) == {f.name: f.field_id for f in table.schema().fields}


def test_table_location_keeps_names_that_are_safe_path_segments(catalog: Catalog) -> None:
    table = ensure_table(catalog, ("Sales Dept", "Order-Items"), orders_schema())
    warehouse = catalog.properties["warehouse"]
    assert table.location() == f"{warehouse}/Sales Dept/Order-Items"


def test_table_location_of_names_that_cannot_be_path_segments(catalog: Catalog) -> None:
    a = ensure_table(catalog, ("s#1", "a/b"), orders_schema())
    b = ensure_table(catalog, ("s#1", "a_b"), orders_schema())
    warehouse = catalog.properties["warehouse"]
    assert a.location() == f"{warehouse}/{path_segment('s#1')}/{path_segment('a/b')}"
    assert "#" not in a.location() and a.location().count("/") == warehouse.count("/") + 2
    assert b.location() != a.location()  # a_b is safe and kept; a/b is not
    path = write_data_file(a, to_arrow([order(1)]))
    commit_files(a, added=[path], lsn=Lsn(10))
    assert read_table(catalog.load_table(("s#1", "a/b"))).num_rows == 1


def _write_with_ids(table: Table, rows: list[dict[str, object]]) -> str:
    """A data file as the executors write it now: the table schema's field ids."""
    schema = arrow_schema_of(table)
    return write_data_file(table, to_arrow(rows, schema).cast(schema))


def test_a_replaced_column_is_a_new_field_and_older_snapshots_keep_the_old(
    catalog: Catalog, orders: Table
) -> None:
    # One file as sparkapply wrote them before field ids, one with them.
    commit_files(orders, added=[write_orders(orders, [1])], lsn=Lsn("0/10"))
    commit_files(orders, added=[_write_with_ids(orders, [order(2)])], lsn=Lsn("0/11"))
    before = orders.metadata.current_snapshot_id
    old_id = orders.schema().find_field("qty").field_id

    replace_columns(orders, [("qty", StringType())], Lsn("0/12"))
    table = catalog.load_table(ORDERS)
    qty = table.schema().find_field("qty")
    assert qty.field_id > old_id and qty.field_type == StringType()
    assert [f.name for f in table.schema().fields] == [f.name for f in orders_schema().fields]
    # The name mapping serves the files without ids: qty still names the old field.
    assert mapping_names(table)["qty"] == old_id
    rows = [dict(order(3), qty="three")]
    commit_files(table, added=[_write_with_ids(table, rows)], lsn=Lsn("0/13"))

    now = read_table(table).sort_by("id")
    assert now.column("qty").to_pylist() == [None, None, "three"]  # not the old ints
    old = read_table(table, snapshot_id=before).sort_by("id")
    assert old.schema.field("qty").type == pa.int32()
    assert old.column("qty").to_pylist() == [10, 20]


def test_a_file_written_before_a_column_was_replaced_is_refused(
    catalog: Catalog, orders: Table
) -> None:
    # Its qty is the old field: the manifest would record its bounds for the new one.
    stale = _write_with_ids(orders, [order(1)])
    replace_columns(orders, [("qty", StringType())], Lsn("0/12"))
    with pytest.raises(SinkError, match="field id"):
        commit_files(catalog.load_table(ORDERS), added=[stale], lsn=Lsn("0/13"))
