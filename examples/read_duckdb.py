"""Read a mirrored table with DuckDB's iceberg extension.

    pip install duckdb==1.5.5 duckdb-extension-iceberg==1.5.5 duckdb-extension-avro==1.5.5
    python examples/read_duckdb.py --config examples/quickstart.toml shop.orders

The extensions come from PyPI wheels of the same version as DuckDB and are loaded from
where those wheels put them, so nothing is downloaded at run time (``INSTALL`` is not
needed). The catalog gives the table's current metadata file; ``iceberg_scan`` reads
it, applying the position-delete files sparkapply writes for updates and deletes.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from urllib.parse import unquote, urlparse

import duckdb
from _catalog import open_catalog, print_rows, table_name


def extension_file(name: str) -> Path:
    """The ``.duckdb_extension`` file the ``duckdb-extension-<name>`` wheel ships."""
    package = importlib.import_module(f"duckdb_extension_{name}")
    root = Path(next(iter(package.__path__)))
    path = root / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.is_file():
        found = sorted(p.parent.name for p in root.glob("extensions/*/*.duckdb_extension"))
        raise SystemExit(
            f"duckdb {duckdb.__version__} needs duckdb-extension-{name}=={duckdb.__version__} "
            f"(installed: {', '.join(found) or 'none'})"
        )
    return path


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    for name in ("avro", "iceberg"):  # iceberg reads its manifests with avro
        con.execute(f"LOAD '{extension_file(name)}'")
    return con


def local_path(uri: str) -> str:
    """DuckDB reads local files by path; object-store URIs (s3://…) pass unchanged."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the sparkapply config file")
    p.add_argument("table", help="schema.table")
    p.add_argument("--limit", type=int, default=10, help="rows to print")
    args = p.parse_args()

    table = open_catalog(args.config).load_table(table_name(args.table))
    con = connect()
    metadata = local_path(table.metadata_location)
    count = con.execute("SELECT count(*) FROM iceberg_scan(?)", [metadata]).fetchone()
    print(f"rows: {count[0] if count else 0}")
    result = con.execute("SELECT * FROM iceberg_scan(?)", [metadata])
    columns = [d[0] for d in result.description]
    print_rows(columns, result.fetchall(), args.limit)


if __name__ == "__main__":
    main()
