"""The PostgreSQL type to Arrow/Iceberg mapping and the OID table."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from sparkapply.convert import types
from sparkapply.convert.types import (
    ColumnKind,
    ColumnTarget,
    PgColumnType,
    column_target,
    numeric_precision_scale,
    pg_type_name,
    relation_columns,
)
from sparkapply.errors import ErrorKind, UnsupportedTypeError
from sparkapply.pgoutput.messages import Relation, RelationColumn


def numeric_typmod(precision: int, scale: int) -> int:
    """PostgreSQL's make_numeric_typmod (PG15+: the scale is 11-bit two's complement)."""
    return ((precision << 16) | (scale & 0x7FF)) + 4


@pytest.mark.parametrize(
    ("oid", "kind", "arrow_type", "iceberg"),
    [
        (21, ColumnKind.INT, pa.int32(), "int"),  # int2
        (23, ColumnKind.INT, pa.int32(), "int"),  # int4
        (20, ColumnKind.LONG, pa.int64(), "long"),  # int8
        (26, ColumnKind.LONG, pa.int64(), "long"),  # oid
        (700, ColumnKind.FLOAT, pa.float32(), "float"),
        (701, ColumnKind.DOUBLE, pa.float64(), "double"),
        (16, ColumnKind.BOOLEAN, pa.bool_(), "boolean"),
        (25, ColumnKind.STRING, pa.large_string(), "string"),  # text
        (1043, ColumnKind.STRING, pa.large_string(), "string"),  # varchar
        (1042, ColumnKind.STRING, pa.large_string(), "string"),  # bpchar
        (19, ColumnKind.STRING, pa.large_string(), "string"),  # name
        (18, ColumnKind.STRING, pa.large_string(), "string"),  # "char"
        (17, ColumnKind.BINARY, pa.large_binary(), "binary"),  # bytea
        (1082, ColumnKind.DATE, pa.date32(), "date"),
        (1083, ColumnKind.TIME, pa.time64("us"), "time"),
        (1114, ColumnKind.TIMESTAMP, pa.timestamp("us"), "timestamp"),
        (1184, ColumnKind.TIMESTAMPTZ, pa.timestamp("us", tz="UTC"), "timestamptz"),
        (2950, ColumnKind.UUID, pa.uuid(), "uuid"),
        (114, ColumnKind.STRING, pa.large_string(), "string"),  # json
        (3802, ColumnKind.STRING, pa.large_string(), "string"),  # jsonb
        (142, ColumnKind.STRING, pa.large_string(), "string"),  # xml
        (1266, ColumnKind.STRING, pa.large_string(), "string"),  # timetz
        (1186, ColumnKind.STRING, pa.large_string(), "string"),  # interval
        (869, ColumnKind.STRING, pa.large_string(), "string"),  # inet
        (650, ColumnKind.STRING, pa.large_string(), "string"),  # cidr
        (829, ColumnKind.STRING, pa.large_string(), "string"),  # macaddr
        (790, ColumnKind.STRING, pa.large_string(), "string"),  # money
        (3904, ColumnKind.STRING, pa.large_string(), "string"),  # int4range
        (4451, ColumnKind.STRING, pa.large_string(), "string"),  # int4multirange
        (3614, ColumnKind.STRING, pa.large_string(), "string"),  # tsvector
        (600, ColumnKind.STRING, pa.large_string(), "string"),  # point
        (1560, ColumnKind.STRING, pa.large_string(), "string"),  # bit
        (5069, ColumnKind.STRING, pa.large_string(), "string"),  # xid8
        (22, ColumnKind.STRING, pa.large_string(), "string"),  # int2vector: not '{...}'
        (2249, ColumnKind.STRING, pa.large_string(), "string"),  # record: not in the table
        (16384, ColumnKind.STRING, pa.large_string(), "string"),  # first user type
        (987654, ColumnKind.STRING, pa.large_string(), "string"),  # enum, domain, citext
    ],
)
def test_scalar_mapping(oid: int, kind: ColumnKind, arrow_type: pa.DataType, iceberg: str) -> None:
    target = column_target(PgColumnType(oid, -1))
    assert target.kind is kind
    assert target.arrow_type == arrow_type
    assert target.iceberg_name == iceberg


@pytest.mark.parametrize(
    ("typmod", "expected"),
    [
        (numeric_typmod(10, 2), ColumnTarget(ColumnKind.DECIMAL, precision=10, scale=2)),
        (numeric_typmod(1, 0), ColumnTarget(ColumnKind.DECIMAL, precision=1, scale=0)),
        (numeric_typmod(38, 0), ColumnTarget(ColumnKind.DECIMAL, precision=38, scale=0)),
        (numeric_typmod(38, 38), ColumnTarget(ColumnKind.DECIMAL, precision=38, scale=38)),
        (numeric_typmod(39, 2), ColumnTarget(ColumnKind.STRING)),  # wider than decimal128
        (numeric_typmod(1000, 0), ColumnTarget(ColumnKind.STRING)),
        (numeric_typmod(5, -2), ColumnTarget(ColumnKind.STRING)),  # PG15+ negative scale
        (numeric_typmod(3, 5), ColumnTarget(ColumnKind.STRING)),  # PG15+ scale > precision
        (-1, ColumnTarget(ColumnKind.STRING)),  # unconstrained
    ],
)
def test_numeric_mapping(typmod: int, expected: ColumnTarget) -> None:
    assert column_target(PgColumnType(1700, typmod)) == expected


def test_numeric_typmods_as_postgresql_16_reports_them() -> None:
    # atttypmod values read from a PostgreSQL 16 catalog.
    assert numeric_precision_scale(655366) == (10, 2)
    assert numeric_precision_scale(2490372) == (38, 0)
    assert numeric_precision_scale(329730) == (5, -2)
    assert numeric_precision_scale(196617) == (3, 5)
    assert numeric_precision_scale(-1) is None


def test_decimal_types() -> None:
    target = column_target(PgColumnType(1700, numeric_typmod(12, 4)))
    assert target.arrow_type == pa.decimal128(12, 4)
    assert target.iceberg_name == "decimal(12, 4)"


@pytest.mark.parametrize(
    ("oid", "typmod", "element", "iceberg"),
    [
        (1005, -1, pa.int32(), "list<int>"),  # _int2
        (1007, -1, pa.int32(), "list<int>"),  # _int4
        (1016, -1, pa.int64(), "list<long>"),  # _int8
        (1009, -1, pa.large_string(), "list<string>"),  # _text
        (1015, 14, pa.large_string(), "list<string>"),  # _varchar(10)
        (1021, -1, pa.float32(), "list<float>"),  # _float4
        (1022, -1, pa.float64(), "list<double>"),  # _float8
        (1000, -1, pa.bool_(), "list<boolean>"),  # _bool
        (1231, numeric_typmod(10, 2), pa.decimal128(10, 2), "list<decimal(10, 2)>"),
        (1231, -1, pa.large_string(), "list<string>"),  # _numeric, unconstrained
        (1182, -1, pa.date32(), "list<date>"),
        (1115, -1, pa.timestamp("us"), "list<timestamp>"),
        (1185, -1, pa.timestamp("us", tz="UTC"), "list<timestamptz>"),
        (2951, -1, pa.uuid(), "list<uuid>"),
        (1001, -1, pa.large_binary(), "list<binary>"),
        (3807, -1, pa.large_string(), "list<string>"),  # _jsonb
        (199, -1, pa.large_string(), "list<string>"),  # _json
        (1187, -1, pa.large_string(), "list<string>"),  # _interval
    ],
)
def test_array_mapping(oid: int, typmod: int, element: pa.DataType, iceberg: str) -> None:
    target = column_target(PgColumnType(oid, typmod))
    assert target.kind is ColumnKind.LIST
    assert target.delimiter == ","
    assert target.arrow_type == pa.large_list(pa.field("element", element))
    assert target.iceberg_name == iceberg


def test_box_arrays_use_a_semicolon() -> None:
    target = column_target(PgColumnType(1020, -1))
    assert target.kind is ColumnKind.LIST
    assert target.delimiter == ";"


def test_every_array_element_is_in_the_oid_table() -> None:
    for array_oid, element_oid in types._ARRAYS.items():
        assert element_oid in types._SCALARS, array_oid
        assert array_oid not in types._SCALARS
        assert array_oid < types.FIRST_NORMAL_OID


def test_invalid_oid_is_unsupported() -> None:
    with pytest.raises(UnsupportedTypeError) as info:
        column_target(PgColumnType(0, -1))
    assert info.value.kind is ErrorKind.OPERATOR


@pytest.mark.parametrize(
    ("ctype", "name"),
    [
        (PgColumnType(23, -1), "int4"),
        (PgColumnType(1700, numeric_typmod(10, 2)), "numeric(10,2)"),
        (PgColumnType(1700, -1), "numeric"),
        (PgColumnType(1043, 24), "varchar(20)"),
        (PgColumnType(1042, 9), "bpchar(5)"),
        (PgColumnType(1114, 3), "timestamp(3)"),
        (PgColumnType(1184, -1), "timestamptz"),
        (PgColumnType(1007, -1), "int4[]"),
        (PgColumnType(1231, numeric_typmod(10, 2)), "numeric(10,2)[]"),
        (PgColumnType(16500, -1, "public.mood"), "public.mood"),
        (PgColumnType(16500, -1), "type oid 16500"),
    ],
)
def test_pg_type_name(ctype: PgColumnType, name: str) -> None:
    assert pg_type_name(ctype) == name


def test_relation_columns_carry_user_type_names() -> None:
    relation = Relation(
        xid=None,
        relation_id=16390,
        namespace="public",
        name="t",
        replica_identity="d",
        columns=(
            RelationColumn(1, "id", 20, -1),
            RelationColumn(0, "mood", 16500, -1),
        ),
    )
    assert relation_columns(relation, {16500: "public.mood"}) == (
        ("id", PgColumnType(20, -1)),
        ("mood", PgColumnType(16500, -1, "public.mood")),
    )
    assert relation_columns(relation)[1] == ("mood", PgColumnType(16500, -1))


def test_types_are_hashable_and_picklable() -> None:
    ctype = PgColumnType(1231, numeric_typmod(10, 2))
    target = column_target(ctype)
    assert pickle.loads(pickle.dumps(ctype)) == ctype
    assert pickle.loads(pickle.dumps(target)) == target
    assert column_target(ctype) is target  # cached: the hot path looks types up per chunk


def test_columns_as_text_describes_only_the_named_columns_as_text() -> None:
    rel = Relation(
        None,
        16390,
        "public",
        "grid",
        "d",
        (RelationColumn(1, "id", 23, -1), RelationColumn(0, "m", 1007, -1)),
    )
    assert types.columns_as_text(rel, set()) is rel
    out = types.columns_as_text(rel, {"m"})
    assert [(c.name, c.type_oid, c.type_modifier, c.flags) for c in out.columns] == [
        ("id", 23, -1, 1),
        ("m", types.TEXT_OID, -1, 0),
    ]
    assert column_target(PgColumnType(out.columns[1].type_oid, -1)).kind is ColumnKind.STRING
