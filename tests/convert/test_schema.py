"""Iceberg schemas for RELATION messages and the schema-evolution plan."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from sparkapply.convert.schema import (
    AddColumn,
    EvolutionPlan,
    WidenColumn,
    can_widen,
    evolved_schema,
    iceberg_identifier,
    iceberg_schema_for,
    identifier_columns,
    plan_evolution,
    relation_identifier,
    source_identifier,
    table_name,
)
from sparkapply.convert.types import relation_columns
from sparkapply.convert.values import arrow_schema, to_arrow_table
from sparkapply.errors import ErrorKind, SchemaChangeError
from sparkapply.pgoutput.messages import Relation, RelationColumn

LSN = 0x16B374D848


def numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def col(name: str, oid: int, typmod: int = -1, *, key: bool = False) -> RelationColumn:
    return RelationColumn(1 if key else 0, name, oid, typmod)


def relation(*columns: RelationColumn, identity: str = "d") -> Relation:
    return Relation(None, 16390, "public", "orders", identity, tuple(columns))


ALL_TYPES = relation(
    col("id", 20, key=True),
    col("small", 21),
    col("n", 23),
    col("oid", 26),
    col("f4", 700),
    col("f8", 701),
    col("amount", 1700, numeric(10, 2)),
    col("big", 1700),
    col("ok", 16),
    col("name", 1043, 24),
    col("data", 17),
    col("day", 1082),
    col("at_time", 1083),
    col("ts", 1114),
    col("tstz", 1184),
    col("u", 2950),
    col("doc", 3802),
    col("mood", 16500),
    col("tags", 1009),
    col("prices", 1231, numeric(10, 2)),
)


def test_schema_for_all_types() -> None:
    schema = iceberg_schema_for(ALL_TYPES, {16500: "public.mood"})
    expected = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "small", IntegerType(), required=False),
        NestedField(3, "n", IntegerType(), required=False),
        NestedField(4, "oid", LongType(), required=False),
        NestedField(5, "f4", FloatType(), required=False),
        NestedField(6, "f8", DoubleType(), required=False),
        NestedField(7, "amount", DecimalType(10, 2), required=False),
        NestedField(8, "big", StringType(), required=False),
        NestedField(9, "ok", BooleanType(), required=False),
        NestedField(10, "name", StringType(), required=False),
        NestedField(11, "data", BinaryType(), required=False),
        NestedField(12, "day", DateType(), required=False),
        NestedField(13, "at_time", TimeType(), required=False),
        NestedField(14, "ts", TimestampType(), required=False),
        NestedField(15, "tstz", TimestamptzType(), required=False),
        NestedField(16, "u", UUIDType(), required=False),
        NestedField(17, "doc", StringType(), required=False),
        NestedField(18, "mood", StringType(), required=False),
        NestedField(19, "tags", ListType(21, StringType(), element_required=False), required=False),
        NestedField(
            20, "prices", ListType(22, DecimalType(10, 2), element_required=False), required=False
        ),
        identifier_field_ids=[1],
    )
    assert schema == expected


def test_arrow_types_are_what_pyiceberg_expects() -> None:
    # The converted Arrow arrays must be exactly pyiceberg's Arrow form of the Iceberg
    # schema, so the sink neither casts nor copies.
    schema = iceberg_schema_for(ALL_TYPES)
    from_iceberg = schema_to_pyarrow(schema, include_field_ids=False)
    converted = arrow_schema(relation_columns(ALL_TYPES))
    assert [f.name for f in converted] == [f.name for f in from_iceberg]
    for ours, theirs in zip(converted, from_iceberg, strict=True):
        assert ours.type == theirs.type, ours.name


def test_identifier_fields_follow_the_key() -> None:
    rel = relation(
        col("tenant", 23, key=True), col("id", 20, key=True), col("note", 25), identity="i"
    )
    schema = iceberg_schema_for(rel)
    assert schema.identifier_field_names() == {"tenant", "id"}
    assert [f.required for f in schema.fields] == [True, True, False]


def test_replica_identity_full_has_no_identifier() -> None:
    # pgoutput flags every column of a FULL table as part of the identity.
    rel = relation(col("a", 23, key=True), col("b", 25, key=True), identity="f")
    schema = iceberg_schema_for(rel)
    assert schema.identifier_field_ids == []
    assert not any(f.required for f in schema.fields)


def test_no_key_no_identifier() -> None:
    assert identifier_columns(relation(col("a", 23), identity="n")) == ()
    assert identifier_columns(relation(col("a", 23), identity="d")) == ()  # no primary key


@pytest.mark.parametrize("oid", [701, 700, 1007])
def test_keys_iceberg_cannot_identify_give_no_identifier(oid: int) -> None:
    rel = relation(col("id", 23, key=True), col("k", oid, key=True))
    schema = iceberg_schema_for(rel)  # would raise if an invalid identifier were set
    assert schema.identifier_field_ids == []
    assert not any(f.required for f in schema.fields)


# --------------------------------------------------------------------------------
# Evolution
# --------------------------------------------------------------------------------

BASE = relation(
    col("id", 20, key=True),
    col("n", 23),
    col("ratio", 700),
    col("amount", 1700, numeric(10, 2)),
    col("tags", 1007),
    col("name", 1043, 24),
    col("note", 25),
)


def test_unchanged_relation_needs_nothing() -> None:
    plan = plan_evolution(iceberg_schema_for(BASE), BASE, lsn=LSN)
    assert plan == EvolutionPlan(table="public.orders", lsn=LSN, identifier_field_names=("id",))
    assert not plan.requires_update


def test_added_columns_are_appended() -> None:
    current = iceberg_schema_for(BASE)  # ids 1..7, tags element 8
    rel = relation(*BASE.columns, col("ids", 1016), col("created", 1184))
    plan = plan_evolution(current, rel)
    assert plan.add == (
        AddColumn("ids", 9, ListType(10, LongType(), element_required=False), "int8[]"),
        AddColumn("created", 11, TimestamptzType(), "timestamptz"),
    )
    assert plan.requires_update and not plan.widen and not plan.dropped


def test_dropped_columns_are_reported_only() -> None:
    rel = relation(*BASE.columns[:5], BASE.columns[6])  # DROP COLUMN name
    plan = plan_evolution(iceberg_schema_for(BASE), rel)
    assert plan.dropped == ("name",)
    assert not plan.requires_update


def test_widenings() -> None:
    rel = relation(
        col("id", 20, key=True),
        col("n", 20),  # int4 -> int8
        col("ratio", 701),  # float4 -> float8
        col("amount", 1700, numeric(14, 2)),  # numeric(10,2) -> numeric(14,2)
        col("tags", 1016),  # int4[] -> int8[]
        col("name", 25),  # varchar(20) -> text: both strings, nothing to do
        col("note", 1043, 104),
    )
    plan = plan_evolution(iceberg_schema_for(BASE), rel, lsn=LSN)
    assert plan.widen == (
        WidenColumn(("n",), 2, IntegerType(), LongType(), "int8"),
        WidenColumn(("ratio",), 3, FloatType(), DoubleType(), "float8"),
        WidenColumn(("amount",), 4, DecimalType(10, 2), DecimalType(14, 2), "numeric(14,2)"),
        WidenColumn(("tags", "element"), 8, IntegerType(), LongType(), "int8[]"),
    )
    assert plan.requires_update and not plan.add


@pytest.mark.parametrize(
    ("replacement", "old_type", "new_type"),
    [
        (col("note", 23), "string", "int4 (int)"),  # text -> int
        (col("n", 25), "int", "text (string)"),  # int -> text
        (col("ratio", 23), "float", "int4 (int)"),
        (col("amount", 1700, numeric(10, 3)), "decimal(10, 2)", "numeric(10,3)"),  # scale
        (col("amount", 1700), "decimal(10, 2)", "numeric (string)"),  # unconstrained
        (col("tags", 1009), "list<int>", "text[] (list<string>)"),  # element int -> text
        (col("tags", 23), "list<int>", "int4 (int)"),
        (col("n", 1007), "int", "int4[] (list<int>)"),
    ],
)
def test_changes_iceberg_cannot_follow(
    replacement: RelationColumn, old_type: str, new_type: str
) -> None:
    columns = [replacement if c.name == replacement.name else c for c in BASE.columns]
    with pytest.raises(SchemaChangeError) as info:
        plan_evolution(iceberg_schema_for(BASE), relation(*columns), lsn=LSN)
    err = info.value
    text = str(err)
    assert f'column "{replacement.name}" of public.orders' in text
    assert f"Iceberg has {old_type}" in text
    assert new_type in text
    assert "16/B374D848" in text  # the LSN, printed as PostgreSQL does
    assert err.context["column"] == replacement.name
    assert err.context["relation"] == "public.orders"
    assert err.kind is ErrorKind.OPERATOR and err.hint
    assert str(pickle.loads(pickle.dumps(err))) == text


@pytest.mark.parametrize(
    "replacement",
    [col("id", 23, key=True), col("amount", 1700, numeric(8, 2))],  # bigint->int, 10->8 digits
)
def test_a_narrower_type_fits_the_wider_column_and_changes_nothing(
    replacement: RelationColumn,
) -> None:
    """An older RELATION can arrive after a newer one (a prepared transaction committed
    after a later ALTER); values of the narrower type fit the wider Iceberg column."""
    columns = [replacement if c.name == replacement.name else c for c in BASE.columns]
    plan = plan_evolution(iceberg_schema_for(BASE), relation(*columns), lsn=LSN)
    assert not plan.widen and not plan.add and not plan.requires_update


def test_can_widen() -> None:
    assert can_widen(IntegerType(), LongType())
    assert can_widen(FloatType(), DoubleType())
    assert can_widen(DecimalType(10, 2), DecimalType(38, 2))
    assert not can_widen(LongType(), IntegerType())
    assert not can_widen(DecimalType(10, 2), DecimalType(12, 3))
    assert not can_widen(IntegerType(), DecimalType(12, 0))
    assert not can_widen(TimestampType(), TimestamptzType())
    assert not can_widen(DateType(), TimestampType())


def test_key_changes() -> None:
    current = iceberg_schema_for(BASE)
    # ALTER TABLE ... ADD COLUMN region text NOT NULL DEFAULT 'eu';
    # then a primary key over (id, n, region).
    rel = relation(
        col("id", 20, key=True),
        col("n", 23, key=True),
        *BASE.columns[2:],
        col("region", 25, key=True),
    )
    plan = plan_evolution(current, rel)
    assert plan.identifier_changed
    assert plan.identifier_field_names == ("id", "n", "region")
    assert plan.make_required == ("n",)
    assert plan.add == (AddColumn("region", 9, StringType(), "text", required=True),)
    assert plan.make_optional == ()

    # ALTER TABLE ... REPLICA IDENTITY FULL: no key any more.
    full = relation(*(col(c.name, c.type_oid, c.type_modifier, key=True) for c in BASE.columns))
    full = Relation(None, 16390, "public", "orders", "f", full.columns)
    plan = plan_evolution(current, full)
    assert plan.identifier_changed and plan.identifier_field_names == ()
    assert plan.make_optional == ("id",)


def test_a_dropped_key_column_becomes_optional() -> None:
    current = iceberg_schema_for(relation(col("id", 20, key=True), col("code", 25, key=True)))
    plan = plan_evolution(current, relation(col("id", 20, key=True)))
    assert plan.dropped == ("code",)
    assert plan.make_optional == ("code",)
    assert plan.identifier_field_names == ("id",) and plan.identifier_changed


def test_evolved_schema_is_a_fixed_point() -> None:
    current = iceberg_schema_for(BASE)
    rel = relation(
        col("id", 20, key=True),
        col("n", 20, key=True),
        col("ratio", 701),
        col("amount", 1700, numeric(12, 2)),
        col("tags", 1016),
        col("note", 25),
        col("more", 1009),
        col("u", 2950),
    )
    plan = plan_evolution(current, rel)
    after = evolved_schema(current, plan)
    assert after.schema_id == current.schema_id + 1
    assert [(f.field_id, f.name, str(f.field_type), f.required) for f in after.fields] == [
        (1, "id", "long", True),
        (2, "n", "long", True),
        (3, "ratio", "double", False),
        (4, "amount", "decimal(12, 2)", False),
        (5, "tags", "list<long>", False),
        (6, "name", "string", False),
        (7, "note", "string", False),
        (9, "more", "list<string>", False),
        (11, "u", "uuid", False),
    ]
    again = plan_evolution(after, rel)
    assert not again.requires_update
    assert again.dropped == ("name",)


# --------------------------------------------------------------------------------
# With pyiceberg itself (a SQLite catalog in a temporary directory, no server)
# --------------------------------------------------------------------------------


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    cat = SqlCatalog(
        "test", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse"
    )
    cat.create_namespace("public")
    return cat


def apply_plan(table: Table, plan: EvolutionPlan) -> None:
    """How a sink can apply a plan with pyiceberg's UpdateSchema."""
    with table.update_schema(allow_incompatible_changes=True) as update:
        for a in plan.add:
            update.add_column(a.name, a.field_type, required=a.required)
        for w in plan.widen:
            update.update_column(w.path, w.new_type)
        for name in plan.make_optional:
            update.make_column_optional(name)
        for name in plan.make_required:
            update.update_column(name, required=True)
        if plan.identifier_changed:
            update.set_identifier_fields(*plan.identifier_field_names)


def test_pyiceberg_applies_the_plan_as_described(catalog: SqlCatalog) -> None:
    table = catalog.create_table("public.orders", schema=iceberg_schema_for(BASE))
    assert table.schema() == iceberg_schema_for(BASE)  # ids survive create_table
    rel = relation(
        col("id", 20, key=True),
        col("n", 20, key=True),
        col("ratio", 701),
        col("amount", 1700, numeric(12, 2)),
        col("tags", 1016),
        col("note", 25),
        col("more", 1009),
        col("region", 25, key=True),
    )
    plan = plan_evolution(table.schema(), rel)
    apply_plan(table, plan)
    got, expected = table.schema(), evolved_schema(iceberg_schema_for(BASE), plan)
    assert got.fields == expected.fields
    assert set(got.identifier_field_ids) == set(expected.identifier_field_ids)
    assert not plan_evolution(got, rel).requires_update


def test_converted_parquet_is_readable_through_iceberg(catalog: SqlCatalog, tmp_path: Path) -> None:
    rel = relation(
        col("id", 20, key=True),
        col("u", 2950),
        col("amount", 1700, numeric(10, 2)),
        col("tstz", 1184),
        col("tags", 1009),
    )
    columns = relation_columns(rel)
    rows = [
        (b"1", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", b"12.50", b"infinity", b'{a,"b c"}'),
        (b"2", None, b"NaN", b"2024-02-29 23:59:59.999999+00", None),
    ]
    data = to_arrow_table(columns, rows)
    table = catalog.create_table("public.orders", schema=iceberg_schema_for(rel))
    # The key column is required in Iceberg; the converted table is nullable everywhere.
    data = data.cast(schema_to_pyarrow(table.schema(), include_field_ids=False))
    path = tmp_path / "data.parquet"
    pq.write_table(data, path)
    table.add_files([str(path)])
    table.append(data)
    back = table.scan().to_arrow()
    assert back.schema.field("u").type == pa.uuid()
    assert back.num_rows == 4
    assert back.slice(0, 2).to_pylist() == data.to_pylist()


def test_relation_to_iceberg_identifier() -> None:
    rel = Relation(None, 1, "Sales Dept", "Order-Items", "d", ())
    catalog_rel = Relation(None, 2, "", "pg_class", "d", ())
    assert source_identifier(rel) == ("Sales Dept", "Order-Items")
    assert source_identifier(catalog_rel) == ("pg_catalog", "pg_class")
    assert table_name(catalog_rel) == "pg_catalog.pg_class"
    assert relation_identifier(rel, {}) == ("Sales Dept", "Order-Items")
    mapping = {"Sales Dept.Order-Items": "sales.order_items.v2"}
    assert relation_identifier(rel, mapping) == ("sales", "order_items.v2")
    assert iceberg_identifier("public", "t", mapping) == ("public", "t")
