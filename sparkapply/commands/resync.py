"""``sparkapply resync``: re-copy one table under a stopped subscriber.

It re-copies the table from a temporary slot's snapshot S'/C' and replaces its
contents in one Iceberg snapshot stamped C' - 1 (see :mod:`sparkapply.copy.driver`,
TABLES ADDED LATER, AND RESYNC, for why that is exact).
"""

from __future__ import annotations

from typing import Any

from sparkapply.config import Config
from sparkapply.copy.driver import CopyReport, TableCopier
from sparkapply.copy.snapshot import published_tables
from sparkapply.errors import ConfigError, PublicationError, SlotError
from sparkapply.source.connection import connect
from sparkapply.source.publisher import check_publisher


def resync(config: Config, table: str, *, spark: Any = None, catalog: Any = None) -> CopyReport:
    """Re-copy one published table (``schema.table``) as of a fresh snapshot and
    replace its Iceberg contents in one snapshot. The subscriber must be stopped. A
    column whose type changed on the publisher past what Iceberg can widen (the apply
    stops at it) is replaced by one of the new type: every row is written again."""
    schema, sep, name = table.partition(".")
    if not sep or not schema or not name:
        raise ConfigError(f"--table must be schema.table, got {table!r}", key="--table")
    src = config.source
    check_publisher(src.dsn, src.publication)
    with connect(
        src.dsn, application_name="sparkapply resync", connect_timeout=src.connect_timeout
    ) as c:
        published = published_tables(c, src.publication)
        row = c.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (src.slot,)
        ).fetchone()
    if (schema, name) not in published:
        raise PublicationError(
            f"table {schema}.{name} is not published by {', '.join(src.publication)}",
            relation=f"{schema}.{name}",
            hint="check the name (schema.table, as in pg_publication_tables) or add the "
            "table to the publication",
        )
    if row is not None and row[0] is not None:
        raise SlotError(
            f"replication slot {src.slot!r} is in use by process {row[0]}: sparkapply is "
            f"running; cannot resync {schema}.{name} under it",
            hint="stop sparkapply, run resync, then start it again",
        )
    if catalog is None:
        from sparkapply.sink.catalog import open_catalog

        catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    if spark is None:
        from sparkapply.apply.session import get_session

        spark = get_session(config.spark.master, config.spark.app_name, config.spark.conf)
    copier = TableCopier(config, spark, catalog)
    return copier.copy_from_temporary_snapshot([(schema, name)], f"resync of {schema}.{name}")
