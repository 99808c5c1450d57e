"""``sparkapply maintain``: maintenance on demand, for one table or every mirrored table."""

from __future__ import annotations

import logging

from sparkapply.config import Config
from sparkapply.errors import ConfigError
from sparkapply.maintain.maintainer import Maintainer, MaintenanceReport
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.cuts import cuts_identifier, protected_snapshots
from sparkapply.sink.progress import LSN_TABLE_PROPERTY
from sparkapply.sink.tables import TableIdentifier
from sparkapply.staging.records import kept_by_staging

log = logging.getLogger(__name__)


def run_maintain(
    config: Config, *, table: str | None = None, dry_run: bool = False
) -> list[MaintenanceReport]:
    """Run every maintenance step that has work on ``table`` (``schema.table``, the
    published name or the Iceberg name it is mapped to), or on every table of the
    catalog that sparkapply writes (it has ``sparkapply.applied-lsn``). Spark starts
    only if a compaction has work; ``dry_run`` changes nothing.

    Run it while sparkapply is stopped, or rely on the run loop's own maintenance: a
    compaction that races the apply is refused at commit, but wastes its work.
    """
    catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    if table is not None:
        mapped = config.sink.tables.get(table, table)
        if mapped.count(".") != 1:
            raise ConfigError(f"--table {table!r} must be schema.table", key="--table")
        ns, name = mapped.split(".")
        idents: list[TableIdentifier] = [(ns, name)]
        if not catalog.table_exists(idents[0]):
            raise ConfigError(
                f"table {mapped} is not in catalog {config.sink.catalog_name}",
                key="--table",
                hint="name a table sparkapply mirrors, as schema.table",
            )
    else:
        idents = []
        for namespace in catalog.list_namespaces():
            for ident in catalog.list_tables(namespace):
                ns, name = ".".join(ident[:-1]), ident[-1]
                if LSN_TABLE_PROPERTY in catalog.load_table((ns, name)).properties:
                    idents.append((ns, name))

    def spark() -> object:
        from sparkapply.apply.session import get_session

        s = config.spark
        return get_session(s.master, s.app_name, s.conf)

    protected = None
    if config.sink.cuts_table:
        protected = protected_snapshots(
            catalog, cuts_identifier(config.sink.cuts_table), config.maintenance.retain_seconds
        )
    maintainer = Maintainer(
        config.maintenance,
        spark,  # type: ignore[arg-type]
        catalog,
        protected=protected,
        waiting=lambda: kept_by_staging(config.work_dir),
    )
    reports = [maintainer.run(ident, dry_run=dry_run) for ident in idents]
    if not reports:
        log.info("no table to maintain")
    return reports
