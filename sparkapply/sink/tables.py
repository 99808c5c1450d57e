"""Iceberg tables: create on first sight, evolve with the publisher, keep the name mapping.

Executors write Parquet files with field ids (``datafiles.arrow_schema_of``), and every
reader resolves their columns by id. Files written by sparkapply before it wrote ids
have none; readers resolve those through the table property
``schema.name-mapping.default`` (column name → field id).

THE NAME MAPPING SERVES THE FILES WITHOUT IDS
    So it says what a name meant when such files were written, and a schema change
    never re-points a name: a column replaced under its name (:func:`replace_columns`)
    is a new field, and the name stays mapped to the old one, so an older snapshot's
    files without ids still read the old column's values. A new column gets an entry
    when its name is free (harmless, and every field keeps one until it is replaced);
    pyiceberg's own schema update would re-point the name, so each schema commit
    states the mapping itself (:func:`_keep_name_mapping`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence

from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
    TableAlreadyExistsError,
    ValidationError,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.name_mapping import MappedField, NameMapping, create_mapping_from_schema
from pyiceberg.types import (
    IcebergType,
    NestedField,
)

from sparkapply import location
from sparkapply.convert.schema import widenings
from sparkapply.errors import SchemaChangeError, SinkError
from sparkapply.lsn import Lsn
from sparkapply.sink.stats import live_rows

logger = logging.getLogger(__name__)

TableIdentifier = tuple[str, str]
"""``(namespace, table)``: the PostgreSQL schema and table name, unless mapped."""

NAME_MAPPING_PROPERTY = TableProperties.DEFAULT_NAME_MAPPING  # "schema.name-mapping.default"

# Properties every table sparkapply creates gets, unless the caller overrides them.
DEFAULT_TABLE_PROPERTIES: Mapping[str, str] = {
    # v2: position deletes (merge-on-read), which every v2 reader applies.
    TableProperties.FORMAT_VERSION: "2",
    # One commit per table per batch means one metadata.json per batch; each holds
    # the whole snapshot list, so keeping all of them grows quadratically. Expiry
    # deletes those beyond the newest previous-versions-max (sink/maintenance.py).
    # None is needed to read a retained snapshot or a cut (the current metadata holds
    # them all), only briefly by a reader holding an older metadata location (a
    # DuckDB query by path): 20 commits of the table are seconds at the busiest, a
    # fifth of what Iceberg's default of 100 keeps, and writes in each file's log.
    TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
    TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "20",
    # Appends merge small manifests once 100 accumulate (Java's default is on, too);
    # without it every batch adds a manifest that every later scan must open.
    TableProperties.MANIFEST_MERGE_ENABLED: "true",
}


def table_name(table: Table) -> str:
    """``namespace.table`` for messages (the catalog name left out)."""
    return ".".join(table.name())


def ensure_table(
    catalog: Catalog,
    identifier: TableIdentifier,
    schema: Schema,
    *,
    properties: Mapping[str, str] | None = None,
) -> Table:
    """Load the table ``identifier``, creating its namespace and itself if missing.

    A new table gets ``schema`` (its identifier fields become the table's, so they
    must be required columns), :data:`DEFAULT_TABLE_PROPERTIES` overridden by
    ``properties``, and a name mapping for every column, all in the creating commit.
    An existing table is returned as it is (use :func:`apply_evolution` to change
    its schema) except that a missing or incomplete name mapping is repaired, since
    sparkapply cannot add files to the table without one.
    """
    name = ".".join(identifier)
    namespace = identifier[0]
    try:
        catalog.create_namespace_if_not_exists(namespace)
        try:
            table = catalog.load_table(identifier)
        except NoSuchTableError:
            table = _create(catalog, identifier, schema, properties)
            logger.info("created Iceberg table %s at %s", name, table.location())
            return table
    except SinkError:
        raise
    except Exception as exc:
        raise SinkError(
            f"cannot load or create Iceberg table: {type(exc).__name__}: {exc}",
            table=name,
            hint="check that the catalog is reachable and the schema is valid for Iceberg",
        ) from exc

    before = table.name_mapping()
    if _kept_mapping(before, table.schema()) != before:
        txn = table.transaction()
        _keep_name_mapping(txn, before)
        _commit_metadata(txn, name, "name mapping repair")
        logger.info("repaired the name mapping of Iceberg table %s", name)
    return table


def _create(
    catalog: Catalog,
    identifier: TableIdentifier,
    schema: Schema,
    properties: Mapping[str, str] | None,
) -> Table:
    props = {**DEFAULT_TABLE_PROPERTIES, **(properties or {})}
    # The catalog renumbers field ids on create, so the mapping is built from the
    # schema as created, inside the same (atomic) create transaction.
    txn = catalog.create_table_transaction(
        identifier, schema, location=_table_location(catalog, identifier), properties=props
    )
    _keep_name_mapping(txn, None)
    # Another process may have created it between our load and our create: use theirs.
    with contextlib.suppress(TableAlreadyExistsError, CommitFailedException):
        txn.commit_transaction()
    return catalog.load_table(identifier)


def _table_location(catalog: Catalog, identifier: TableIdentifier) -> str | None:
    """The location for a new table whose names cannot be path segments as they are
    (``/``, ``#``, ``?``, ``%``; see :func:`sparkapply.location.path_segment`): the
    catalog's own default with those segments made safe. None (the catalog's default)
    for every other name, and for catalogs that choose locations server-side (REST)."""
    namespace, name = identifier
    if all(location.path_segment(n) == n for n in identifier):
        return None
    if not isinstance(catalog, MetastoreCatalog):
        return None
    # pyiceberg's own rule (warehouse/ns/table, warehouse/ns.db/table for Hive and
    # Glue, or the namespace's location property), so the layout stays the catalog's.
    default = catalog._get_default_warehouse_location(namespace, name)
    parent = default.removesuffix("/" + name)
    for suffix in (".db", ""):
        if parent.endswith("/" + namespace + suffix):
            cut = len(namespace + suffix)
            parent = parent[:-cut] + location.path_segment(namespace) + suffix
            break
    return location.join(parent, location.path_segment(name))


def apply_evolution(
    table: Table,
    *,
    add_columns: Sequence[tuple[str, IcebergType]] = (),
    widen: Sequence[tuple[str, IcebergType]] = (),
    identifier_fields: Sequence[str] | None = None,
    make_optional: Sequence[str] = (),
    lsn: Lsn | None = None,
) -> bool:
    """Evolve ``table``'s schema in one metadata commit; True if anything changed.

    ``add_columns`` become new optional top-level columns (old files read them as
    null). ``widen`` changes a column's type to a wider one the Iceberg spec allows
    (int → long, float → double, decimal(P,S) → decimal(P',S) with P' ≥ P, also as
    a list's element type). ``identifier_fields`` (the new replica-identity key; an
    empty list for none) replaces the identifier fields when not None, and
    ``make_optional`` names required columns that left the key (they may be null
    from now on, e.g. once dropped on the publisher).

    IDENTIFIER FIELDS ARE ADVISORY. They tell readers (Flink, Trino) the key; the
    apply never uses them. Iceberg wants them required, and a column that was
    optional cannot become required safely (old rows may hold nulls: PostgreSQL does
    not replicate the fill of an added column). So a new key whose columns are all
    required becomes the identifier; any other new key clears the identifier fields
    (logged), and the table goes on without them.

    Idempotent, so it can be repeated after a crash: adding a column that exists
    with the same type, or widening to the type a column already has (or to a
    narrower type it was already widened from) does nothing. A column that exists
    with an incompatible type, a narrowing, or a key column that is not required
    raises :class:`SchemaChangeError` naming the table, column, both types and
    ``lsn``. The name mapping is updated in the same commit.
    """
    name = table_name(table)
    schema = table.schema()
    top = {f.name: f for f in schema.fields}
    new_columns, type_updates = _column_changes(name, top, add_columns, widen, lsn)
    new_key = _new_identifier(name, schema, new_columns, identifier_fields)
    optional = [
        c for c in make_optional if c in top and top[c].required and c not in (new_key or ())
    ]

    if not new_columns and not type_updates and new_key is None and not optional:
        return False

    with _schema_commit(table, "schema change", lsn) as txn, txn.update_schema() as update:
        for column, new_type in new_columns:
            update.add_column((column,), new_type, required=False)
        for path, new_type in type_updates:
            update.update_column(path, field_type=new_type)
        if new_key is not None:
            update.set_identifier_fields(*new_key)
        for column in optional:
            update.make_column_optional(column)
    logger.info(
        "evolved Iceberg table %s: added %s, widened %s, key %s, now optional %s",
        name,
        [c for c, _ in new_columns],
        [".".join(p) for p, _ in type_updates],
        new_key,
        optional,
    )
    return True


def note_added_to_rows(table: Table, added: Sequence[str]) -> None:
    """Columns added to a table with rows read null in those rows. PostgreSQL sends no
    change for them; a column whose older rows may hold values (a default, a column
    newly published) had the table copied again before this (copy/driver.py, COLUMNS
    THAT ARRIVE WITH VALUES), so these are null on the publisher too. Say so once, at
    INFO, with the way on should a row have been given a value the catalog cannot show
    (a column filled while it was left out of the publication's column list)."""
    rows = live_rows(table) if added else 0
    if rows:
        logger.info(
            "Iceberg table %s: column(s) %s added, with no default; its %s existing "
            "rows read null there, as on the publisher. `sparkapply verify` shows any "
            "row that differs; `sparkapply resync` of the table copies them",
            table_name(table),
            ", ".join(added),
            f"{rows:,}",
        )


@contextlib.contextmanager
def _schema_commit(table: Table, what: str, lsn: Lsn | None) -> Iterator[Transaction]:
    """A transaction for schema updates, committed with the name mapping kept (see THE
    NAME MAPPING SERVES THE FILES WITHOUT IDS); an update Iceberg refuses is a
    :class:`SchemaChangeError` naming the table."""
    before = table.name_mapping()
    txn = table.transaction()
    try:
        yield txn
    except (ValidationError, ValueError) as exc:
        raise SchemaChangeError(
            f"Iceberg refused the schema change: {exc}", table=table_name(table), lsn=lsn
        ) from exc
    _keep_name_mapping(txn, before)
    _commit_metadata(txn, table_name(table), what, lsn=lsn)


def replace_columns(
    table: Table, columns: Sequence[tuple[str, IcebergType]], lsn: Lsn | None
) -> None:
    """Replace each column by an optional one of the new type, in the same place, in
    one metadata commit: for a copy, which writes every row again, after a type
    change Iceberg cannot widen or a column dropped and added again under its name.
    The old field is deleted and a new one (a new field id) added: two schema
    updates, as one that deletes a name and adds it again finds the old field when
    it moves it. Older snapshots keep the old field, and their files hold it by its
    id (or, written without ids, by the name mapping, which keeps the name on the
    old field): they read the old column's values. A replaced key column leaves the
    table without identifier fields."""
    name = table_name(table)
    schema = table.schema()
    order = [f.name for f in schema.fields]
    replaced = {c for c, _ in columns}
    with _schema_commit(table, "column replacement", lsn) as txn:
        with txn.update_schema(allow_incompatible_changes=True) as update:
            if replaced & set(schema.identifier_field_names()):
                update.set_identifier_fields()
            for column in sorted(replaced):
                update.delete_column(column)
        with txn.update_schema() as update:
            for column, new_type in columns:
                update.add_column((column,), new_type, required=False)
            for column in order:
                if column in replaced:
                    at = order.index(column)
                    if at == 0:
                        update.move_first(column)
                    else:
                        update.move_after(column, order[at - 1])
    logger.warning(
        "replaced column(s) %s of Iceberg table %s by new field(s) of the same name (%s), "
        "as the type Iceberg holds cannot become the publisher's; snapshots before this "
        "one keep the old column",
        sorted(replaced),
        name,
        ", ".join(f"{c} {t}" for c, t in columns),
    )


def _column_changes(
    table: str,
    top: Mapping[str, NestedField],
    add_columns: Sequence[tuple[str, IcebergType]],
    widen: Sequence[tuple[str, IcebergType]],
    lsn: Lsn | None,
) -> tuple[list[tuple[str, IcebergType]], list[tuple[tuple[str, ...], IcebergType]]]:
    """The columns to add and the ``update_column`` calls to make; an added column the
    table already has is a widening (or nothing), so a replay after a crash is a no-op."""
    new_columns: list[tuple[str, IcebergType]] = []
    type_updates: list[tuple[tuple[str, ...], IcebergType]] = []
    for column, new_type in add_columns:
        if column in top:
            type_updates += _widening(table, top[column], new_type, lsn)
        else:
            new_columns.append((column, new_type))
    for column, new_type in widen:
        if column not in top:
            raise SchemaChangeError(
                f"cannot change the type of a column the table does not have to {new_type}",
                table=table,
                column=column,
                lsn=lsn,
            )
        type_updates += _widening(table, top[column], new_type, lsn)
    return new_columns, type_updates


def _widening(
    table: str, field: NestedField, new_type: IcebergType, lsn: Lsn | None
) -> list[tuple[tuple[str, ...], IcebergType]]:
    """The ``update_column`` calls that take ``field`` to ``new_type``; [] if none needed
    (also when the column is already wider: a replayed, older RELATION's values fit)."""
    old_type = field.field_type
    found = widenings(old_type, new_type, (field.name,), field.field_id)
    if found is not None:
        return [(w.path, w.new_type) for w in found]
    raise SchemaChangeError(
        f"cannot change column type from {old_type} to {new_type}: Iceberg can only widen "
        "int to long, float to double and decimal(P,S) to decimal(P',S) with P' >= P",
        table=table,
        column=field.name,
        lsn=lsn,
        hint="recreate the table (or map the column to a new name) and resynchronise it",
    )


def _new_identifier(
    table: str,
    schema: Schema,
    new_columns: list[tuple[str, IcebergType]],
    wanted: Sequence[str] | None,
) -> list[str] | None:
    """The identifier fields to set (see IDENTIFIER FIELDS ARE ADVISORY); None when
    they stay as they are."""
    if wanted is None or set(wanted) == schema.identifier_field_names():
        return None
    top = {f.name: f for f in schema.fields}
    added = {c for c, _ in new_columns}
    unfit = [c for c in wanted if c in added or c not in top or not top[c].required]
    if not unfit:
        return list(wanted)
    if not schema.identifier_field_ids:
        return None
    logger.warning(
        "Iceberg table %s: the new replica identity (%s) cannot be its identifier fields "
        "(%s optional in Iceberg); the identifier fields are cleared, the apply follows "
        "the new key all the same",
        table,
        ", ".join(wanted),
        ", ".join(unfit),
    )
    return []


def _commit_metadata(txn: Transaction, table: str, what: str, *, lsn: Lsn | None = None) -> None:
    try:
        txn.commit_transaction()
    except CommitFailedException as exc:
        raise SinkError(
            f"{what} conflicted with a concurrent commit: {exc}",
            table=table,
            lsn=lsn,
            hint="another writer changed the table; retry (the change is idempotent)",
        ) from exc
    except Exception as exc:
        raise SinkError(
            f"{what} failed: {type(exc).__name__}: {exc}", table=table, lsn=lsn
        ) from exc


def _keep_name_mapping(txn: Transaction, before: NameMapping | None) -> None:
    """Stage the name mapping ``before`` (the table's before the transaction; None for
    a new table) with entries for the fields it lacks whose names are free."""
    metadata = txn.table_metadata
    kept = _kept_mapping(before, metadata.schema())
    if kept != metadata.name_mapping():
        txn.set_properties({NAME_MAPPING_PROPERTY: kept.model_dump_json()})


def _kept_mapping(mapping: NameMapping | None, schema: Schema) -> NameMapping:
    """``mapping`` as it is, plus an entry for each field of ``schema`` it does not map
    whose name it leaves free (see THE NAME MAPPING SERVES THE FILES WITHOUT IDS)."""
    fresh = list(create_mapping_from_schema(schema))
    return NameMapping(fresh if mapping is None else _kept(list(mapping), fresh))


def _kept(old: list[MappedField], new: list[MappedField]) -> list[MappedField]:
    """``old``, its entries' sub-fields kept the same way, then the entries of ``new``
    whose ids and names ``old`` does not have."""
    by_id = {f.field_id: f for f in new if f.field_id is not None}
    kept = [
        f.model_copy(update={"fields": _kept(f.fields, by_id[f.field_id].fields)})
        if f.field_id in by_id
        else f
        for f in old
    ]
    ids = {f.field_id for f in old}
    taken = {name for f in old for name in f.names}
    kept += [f for f in new if f.field_id not in ids and not taken.intersection(f.names)]
    return kept
