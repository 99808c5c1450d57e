"""Shared by the reading examples: open the Iceberg catalog a sparkapply config names.

The examples read the same TOML file sparkapply runs with, so that the catalog
properties (``[sink.catalog]``, with ``{work_dir}`` filled in) are written once.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog import Catalog, load_catalog

from sparkapply.config import load_config


def open_catalog(config_path: str) -> Catalog:
    config = load_config(config_path)
    return load_catalog(config.sink.catalog_name, **config.catalog_properties())


def table_name(name: str, config_path: str | None = None) -> tuple[str, str]:
    """``schema.table`` → the Iceberg identifier: the config's ``[sink.tables]``
    rename when it has one, else namespace = the PostgreSQL schema."""
    namespace, _, table = name.partition(".")
    if not table:
        raise SystemExit(f"name the table as schema.table, not {name!r}")
    if config_path is not None:
        return load_config(config_path).table_identifier(namespace, table)
    return namespace, table


def print_rows(columns: list[str], rows: list[tuple[Any, ...]], limit: int) -> None:
    """One header line, then up to ``limit`` rows, tab-separated, sorted."""
    print("\t".join(columns))
    for row in sorted(rows, key=repr)[:limit]:
        print("\t".join("NULL" if v is None else str(v) for v in row))
