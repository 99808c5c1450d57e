"""Independent readers of the mirror: DuckDB's iceberg extension (from PyPI), beside
pyiceberg's own scan. Every table sparkapply writes must read the same in both."""

from __future__ import annotations

import glob
import os
from types import ModuleType

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import pyarrow as pa
from pyiceberg.table import Table


def _extension(module: ModuleType, name: str) -> str:
    root = os.path.dirname(module.__file__ or "")
    found = glob.glob(os.path.join(root, "extensions", "*", f"{name}.duckdb_extension"))
    assert found, f"the {name} extension is not in {module.__name__}"
    return found[0]


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"LOAD '{_extension(duckdb_extension_avro, 'avro')}'")
    con.execute(f"LOAD '{_extension(duckdb_extension_iceberg, 'iceberg')}'")
    return con


def read_with_duckdb(table: Table) -> pa.Table:
    """The table's current snapshot as DuckDB's iceberg_scan reads it."""
    con = duckdb_connection()
    try:
        location = table.metadata_location.replace("'", "''")
        return con.execute(f"SELECT * FROM iceberg_scan('{location}')").to_arrow_table()
    finally:
        con.close()
