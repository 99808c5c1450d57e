"""The Iceberg table of a published relation: created from, and evolved to, a RELATION."""

from __future__ import annotations

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.types import IcebergType

from sparkapply.convert.schema import (
    EvolutionPlan,
    iceberg_schema_for,
    plan_evolution,
    widened_type,
    widened_types,
)
from sparkapply.lsn import Lsn
from sparkapply.pgoutput.messages import Relation
from sparkapply.sink.tables import (
    TableIdentifier,
    apply_evolution,
    ensure_table,
    replace_columns,
)


def table_for_relation(
    catalog: Catalog,
    ident: TableIdentifier,
    relation: Relation,
    *,
    lsn: int | None,
    replace_changed: bool = False,
) -> Table:
    """Load (or create) the table and evolve its schema to ``relation``."""
    table = ensure_table(catalog, ident, iceberg_schema_for(relation))
    return evolve_to(catalog, ident, table, relation, lsn=lsn, replace_changed=replace_changed)


def evolve_to(
    catalog: Catalog,
    ident: TableIdentifier,
    table: Table,
    relation: Relation,
    *,
    lsn: int | None,
    replace_changed: bool = False,
) -> Table:
    """Apply what ``relation`` changes in the table's schema (nothing if nothing does);
    a change Iceberg cannot follow raises SchemaChangeError naming table, column, LSN,
    unless ``replace_changed`` (a copy, which writes every row again): then such a
    column is replaced by one of the new type, in its place."""
    plan = plan_evolution(table.schema(), relation, lsn=lsn, replace_changed=replace_changed)
    if plan.replace:
        replace_columns(table, plan.replace, None if lsn is None else Lsn(lsn))
        table = catalog.load_table(ident)
        plan = plan_evolution(table.schema(), relation, lsn=lsn)
    if not plan.requires_update:
        return table
    changed = apply_evolution(
        table,
        add_columns=[(a.name, a.field_type) for a in plan.add],
        widen=_widenings(table, plan),
        identifier_fields=(list(plan.identifier_field_names) if plan.identifier_changed else None),
        make_optional=plan.make_optional,
        lsn=None if lsn is None else Lsn(lsn),
    )
    return catalog.load_table(ident) if changed else table


def _widenings(table: Table, plan: EvolutionPlan) -> list[tuple[str, IcebergType]]:
    """Top-level ``(column, new type)``; a list whose element widens gets its whole
    new list type."""
    widened = widened_types(plan)
    schema = table.schema()
    columns = dict.fromkeys(w.path[0] for w in plan.widen)
    return [(c, widened_type(schema.find_field(c).field_type, (c,), widened)) for c in columns]
