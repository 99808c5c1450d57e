"""Iceberg schemas for published relations, and the rules for following schema changes.

This module owns two decisions: what Iceberg schema a RELATION message describes
(:func:`iceberg_schema_for`), and what a new RELATION message for a known table means
for its Iceberg schema (:func:`plan_evolution`). It builds pyiceberg's pure value
classes (``Schema``, ``NestedField``, the types) and never touches a catalog: applying
an :class:`EvolutionPlan` to a table is the sink's job.

IDENTIFIER FIELDS

A table's replica-identity key columns become Iceberg identifier fields and are
``required``; every other column is optional, because PostgreSQL may send NULL for it.
Only REPLICA IDENTITY DEFAULT (the primary key) and USING INDEX name a key:
with FULL, pgoutput flags *every* column as part of the identity, yet those columns
are nullable and not unique, so a FULL (or NOTHING) table gets no identifier fields.
Iceberg refuses float, double and list identifier fields; a key with such a column
gets no identifier fields at all (a partial identifier would claim a uniqueness that
does not hold). Apply does not depend on identifier fields (it keys rows by the
RELATION message); they tell readers such as Flink or Trino what the key is.

SCHEMA CHANGES

PostgreSQL sends a new RELATION message before the first change after any DDL on a
published table. It carries only the current columns, by name, so:

- a column whose name is new is *added*, optional, at the end of the Iceberg schema;
- a column that disappeared is *dropped* from the relation but stays in Iceberg (old
  rows keep their values, new rows have null); nothing to do but report it;
- a column whose type changed is *widened* when Iceberg allows it (int to long, float
  to double, decimal(P,S) to decimal(P',S) with P' > P, also as a list element);
  anything else is *replaced* when the table is copied again (``replace_changed``:
  a new field of the same name and place, copy/driver.py, A COLUMN ICEBERG CANNOT
  RETYPE), and raises :class:`SchemaChangeError` naming the table, column, both types
  and the LSN otherwise, because writing on would either fail or silently change values;
- the identifier fields follow the key; key columns must become required and former
  key columns optional. The plan lists these separately because Iceberg treats
  "make required" as an incompatible change: it is safe for a column that existed
  before (the mirror holds exactly the publisher's rows, and PostgreSQL keeps key
  columns NOT NULL), but not for a key column added by the same DDL: PostgreSQL fills
  existing rows with the column default without replicating them, so in Iceberg those
  rows have no value. The sink decides (e.g. refuse unless the table is empty).

What the messages cannot tell apart: a rename looks like a drop plus an add, and a
column dropped and re-added under the same name looks like a type change, or like no
change at all. The publisher's catalog tells them apart (copy/columns.py): both have
the table copied again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from sparkapply.convert.types import (
    ColumnKind,
    ColumnTarget,
    PgColumnType,
    column_target,
    pg_type_name,
    relation_columns,
)
from sparkapply.errors import SchemaChangeError
from sparkapply.pgoutput.messages import Relation

_PRIMITIVES: dict[ColumnKind, Callable[[], PrimitiveType]] = {
    ColumnKind.INT: IntegerType,
    ColumnKind.LONG: LongType,
    ColumnKind.FLOAT: FloatType,
    ColumnKind.DOUBLE: DoubleType,
    ColumnKind.BOOLEAN: BooleanType,
    ColumnKind.STRING: StringType,
    ColumnKind.BINARY: BinaryType,
    ColumnKind.DATE: DateType,
    ColumnKind.TIME: TimeType,
    ColumnKind.TIMESTAMP: TimestampType,
    ColumnKind.TIMESTAMPTZ: TimestamptzType,
    ColumnKind.UUID: UUIDType,
}

# Kinds Iceberg refuses as identifier fields (spec: no float, double, or nested in a list).
_NOT_IDENTIFIER = frozenset({ColumnKind.FLOAT, ColumnKind.DOUBLE, ColumnKind.LIST})

# Replica identities that name a unique, NOT NULL key: DEFAULT (primary key), INDEX.
_KEYED_IDENTITIES = frozenset({"d", "i"})


def iceberg_type(target: ColumnTarget, next_id: Callable[[], int]) -> IcebergType:
    """The Iceberg type of a column target; ``next_id`` numbers list elements."""
    if target.kind is ColumnKind.DECIMAL:
        return DecimalType(target.precision, target.scale)
    if target.kind is ColumnKind.LIST:
        assert target.element is not None
        element_id = next_id()
        return ListType(
            element_id=element_id,
            element_type=iceberg_type(target.element, next_id),
            element_required=False,  # PostgreSQL array elements may be NULL
        )
    return _PRIMITIVES[target.kind]()


def source_identifier(relation: Relation) -> tuple[str, str]:
    """``(schema, table)`` of a relation in PostgreSQL (pgoutput spells pg_catalog "")."""
    return relation.namespace or "pg_catalog", relation.name


def table_name(relation: Relation) -> str:
    """``schema.table`` of a relation, as errors and plans name it."""
    return ".".join(source_identifier(relation))


def iceberg_identifier(schema: str, name: str, table_map: Mapping[str, str]) -> tuple[str, str]:
    """The Iceberg ``(namespace, table)`` of the PostgreSQL table ``schema.name``: the
    ``[sink.tables]`` mapping (``"pg_schema.pg_table" = "namespace.table"``) when it
    names the table, else the PostgreSQL names themselves."""
    mapped = table_map.get(f"{schema}.{name}")
    if mapped:
        namespace, table = mapped.split(".", 1)
        return namespace, table
    return schema, name


def relation_identifier(relation: Relation, table_map: Mapping[str, str]) -> tuple[str, str]:
    """The Iceberg ``(namespace, table)`` of a relation (see :func:`iceberg_identifier`)."""
    return iceberg_identifier(*source_identifier(relation), table_map)


def identifier_columns(
    relation: Relation, type_names: Mapping[int, str] | None = None
) -> tuple[str, ...]:
    """The columns that become Iceberg identifier fields (see IDENTIFIER FIELDS)."""
    if relation.replica_identity not in _KEYED_IDENTITIES:
        return ()
    keys = [c for c in relation.columns if c.is_key]
    names = type_names or {}
    for c in keys:
        target = column_target(PgColumnType(c.type_oid, c.type_modifier, names.get(c.type_oid)))
        if target.kind in _NOT_IDENTIFIER:
            return ()
    return tuple(c.name for c in keys)


def iceberg_schema_for(relation: Relation, type_names: Mapping[int, str] | None = None) -> Schema:
    """The Iceberg schema of a published relation.

    Columns keep PostgreSQL's names and order and get field ids 1..n; list elements
    are numbered after them (n+1, ...). Key columns are required identifier fields.
    """
    columns = relation_columns(relation, type_names)
    keys = set(identifier_columns(relation, type_names))
    element_ids = itertools.count(len(columns) + 1)
    fields = [
        NestedField(
            field_id=i,
            name=name,
            field_type=iceberg_type(column_target(ctype), element_ids.__next__),
            required=name in keys,
        )
        for i, (name, ctype) in enumerate(columns, start=1)
    ]
    identifier_ids = [f.field_id for f in fields if f.name in keys]
    return Schema(*fields, identifier_field_ids=identifier_ids)


# --------------------------------------------------------------------------------
# Evolution
# --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddColumn:
    """A column to append.

    ``field_id`` and the list element ids in ``field_type`` are the ids pyiceberg's
    ``UpdateSchema.add_column`` assigns when the plan's columns are added in order
    (the column, then its element); ``add_column`` renumbers anyway. ``required`` is
    True only for a column that joins the key (an identifier field must be required,
    and pyiceberg cannot make a column required in the update that adds it); rows that
    already exist have no value for it, see SCHEMA CHANGES.
    """

    name: str
    field_id: int
    field_type: IcebergType
    pg_type: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class WidenColumn:
    """A type promotion Iceberg allows. ``path`` is the column name, followed by
    ``"element"`` when it is a list's element type that widens."""

    path: tuple[str, ...]
    field_id: int
    old_type: PrimitiveType
    new_type: PrimitiveType
    pg_type: str


@dataclass(frozen=True, slots=True)
class EvolutionPlan:
    """What a new RELATION message means for a table's Iceberg schema.

    ``identifier_field_names`` is the complete new identifier (relation order);
    ``make_required`` lists the existing columns it needs required that are not yet
    (added key columns carry ``AddColumn.required``), ``make_optional`` the required
    columns that are no longer key columns (including dropped ones). ``dropped`` needs
    no action. Widenings refer to existing fields, so they can be applied in the same
    update as the additions.
    """

    table: str
    lsn: int | None
    add: tuple[AddColumn, ...] = ()
    widen: tuple[WidenColumn, ...] = ()
    # Columns whose type changed past what Iceberg can widen, planned with
    # ``replace_changed`` (a copy, which rewrites every row): (name, new type).
    replace: tuple[tuple[str, IcebergType], ...] = ()
    dropped: tuple[str, ...] = ()
    identifier_field_names: tuple[str, ...] = ()
    identifier_changed: bool = False
    make_required: tuple[str, ...] = ()
    make_optional: tuple[str, ...] = ()

    @property
    def requires_update(self) -> bool:
        """True if the Iceberg schema must change (dropped columns alone do not)."""
        return bool(
            self.add
            or self.widen
            or self.replace
            or self.identifier_changed
            or self.make_required
            or self.make_optional
        )


def plan_evolution(
    current: Schema,
    relation: Relation,
    type_names: Mapping[int, str] | None = None,
    *,
    lsn: int | None = None,
    replace_changed: bool = False,
) -> EvolutionPlan:
    """Compare a table's Iceberg schema with a RELATION message (see SCHEMA CHANGES).

    Raises :class:`SchemaChangeError` for a type change Iceberg cannot follow; with
    ``replace_changed`` (a copy: every row is written again) plans to replace the
    column instead.
    """
    table = table_name(relation)
    by_name = {f.name: f for f in current.fields}
    columns = relation_columns(relation, type_names)
    fresh_ids = itertools.count(current.highest_field_id + 1)
    unused_ids = itertools.count(1)  # element ids of compared types are never compared

    new_ids = identifier_columns(relation, type_names)
    add: list[AddColumn] = []
    widen: list[WidenColumn] = []
    replace: list[tuple[str, IcebergType]] = []
    for name, ctype in columns:
        target = column_target(ctype)
        field = by_name.get(name)
        if field is None:
            field_id = next(fresh_ids)
            new_type = iceberg_type(target, fresh_ids.__next__)
            required = name in new_ids
            add.append(AddColumn(name, field_id, new_type, pg_type_name(ctype), required))
            continue
        new_type = iceberg_type(target, unused_ids.__next__)
        pg_type = pg_type_name(ctype)
        found = widenings(field.field_type, new_type, (name,), field.field_id, pg_type)
        if found is None and replace_changed:
            replace.append((name, new_type))
            continue
        if found is None:
            raise _type_change_error(table, name, field.field_type, new_type, pg_type, lsn)
        widen.extend(found)

    present = {name for name, _ in columns}
    old_ids = {current.find_column_name(i) for i in current.identifier_field_ids}
    return EvolutionPlan(
        table=table,
        lsn=lsn,
        add=tuple(add),
        widen=tuple(widen),
        replace=tuple(replace),
        dropped=tuple(f.name for f in current.fields if f.name not in present),
        identifier_field_names=new_ids,
        identifier_changed=set(new_ids) != old_ids,
        make_required=tuple(n for n in new_ids if n in by_name and not by_name[n].required),
        make_optional=tuple(f.name for f in current.fields if f.required and f.name not in new_ids),
    )


def arrays_not_held_as_lists(relation: Relation, current: Schema) -> list[str]:
    """The array columns of ``relation`` that ``current`` does not hold as lists (new
    ones, or held as text). Only of these is the publisher's catalog asked whether they
    have more than one dimension (convert/types.py, ARRAYS OF MORE THAN ONE DIMENSION):
    an array column that was text before (ALTER TYPE) and is not so declared is a
    type change."""
    held = {f.name: f.field_type for f in current.fields}
    return [
        c.name
        for c in relation.columns
        if column_target(PgColumnType(c.type_oid, c.type_modifier)).kind is ColumnKind.LIST
        and not isinstance(held.get(c.name), ListType)
    ]


def can_widen(old: IcebergType, new: IcebergType) -> bool:
    """Iceberg's allowed primitive promotions (format v1/v2).

    Our own rule rather than pyiceberg's ``promote``, which also allows read-time
    conversions (string ↔ binary, fixed → uuid) and, in 0.12, does not compare
    decimal scales."""
    if isinstance(old, IntegerType):
        return isinstance(new, LongType)
    if isinstance(old, FloatType):
        return isinstance(new, DoubleType)
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return new.scale == old.scale and new.precision > old.precision
    return False


def widenings(
    old: IcebergType, new: IcebergType, path: tuple[str, ...], field_id: int, pg_type: str = ""
) -> list[WidenColumn] | None:
    """The promotions that turn ``old`` into ``new``; None if Iceberg cannot.

    The one walk of a column's type (the planner, and the sink's idempotent schema
    update, both use it): a list is compared by its element type; an already wider
    type needs no promotion."""
    if isinstance(old, ListType) and isinstance(new, ListType):
        # Compared by element type: element ids differ by construction, and element
        # nullability is ours to choose (always optional), not a type change.
        element_path = (*path, "element")
        return widenings(old.element_type, new.element_type, element_path, old.element_id, pg_type)
    if old == new:
        return []
    if isinstance(old, PrimitiveType) and isinstance(new, PrimitiveType):
        if can_widen(old, new):
            return [WidenColumn(path, field_id, old, new, pg_type)]
        if can_widen(new, old):
            # Iceberg already holds the wider type, e.g. a RELATION of an older version
            # arriving after a newer one (a prepared transaction committed after a later
            # ALTER): its values fit the wider column, nothing changes.
            return []
    return None


def _type_change_error(
    table: str, column: str, old: IcebergType, new: IcebergType, pg_type: str, lsn: int | None
) -> SchemaChangeError:
    return SchemaChangeError(
        f'column "{column}" of {table} changed type: Iceberg has {old}, PostgreSQL now '
        f"sends {pg_type} ({new}), and Iceberg can only widen int to long, "
        "float to double and decimal(P,S) to a larger P",
        hint="revert the type change on the publisher; or stop sparkapply and copy the "
        f"table again with the new type: sparkapply resync --config <file> --table {table}",
        relation=table,
        column=column,
        lsn=lsn,
    )


def evolved_schema(current: Schema, plan: EvolutionPlan) -> Schema:
    """The schema ``current`` becomes when ``plan`` is applied in full.

    New columns get the ids their :class:`AddColumn` carries. This is what the sink's
    schema update should arrive at; a plan computed against the result for the same
    relation is empty.
    """
    widened = widened_types(plan)
    required = set(plan.identifier_field_names)
    fields = [
        NestedField(
            field_id=f.field_id,
            name=f.name,
            field_type=widened_type(f.field_type, (f.name,), widened),
            required=f.name in required or (f.required and f.name not in plan.make_optional),
            doc=f.doc,
        )
        for f in current.fields
    ]
    fields.extend(
        NestedField(a.field_id, a.name, a.field_type, required=a.required) for a in plan.add
    )
    by_name = {f.name: f.field_id for f in fields}
    return Schema(
        *fields,
        schema_id=current.schema_id + 1 if plan.requires_update else current.schema_id,
        identifier_field_ids=[by_name[n] for n in plan.identifier_field_names],
    )


def widened_types(plan: EvolutionPlan) -> dict[tuple[str, ...], IcebergType]:
    """``path → new type`` of the plan's promotions (for :func:`widened_type`)."""
    return {w.path: w.new_type for w in plan.widen}


def widened_type(
    t: IcebergType, path: tuple[str, ...], widened: Mapping[tuple[str, ...], IcebergType]
) -> IcebergType:
    """The column type ``t`` at ``path`` with the promotions ``widened`` applied
    (a list keeps its element id and nullability)."""
    if isinstance(t, ListType):
        return ListType(
            element_id=t.element_id,
            element_type=widened_type(t.element_type, (*path, "element"), widened),
            element_required=t.element_required,
        )
    return widened.get(path, t)
