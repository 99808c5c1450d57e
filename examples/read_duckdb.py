"""Read a mirrored table with DuckDB's iceberg extension.

    pip install duckdb==1.5.5 duckdb-extension-iceberg==1.5.5 duckdb-extension-avro==1.5.5
    pip install duckdb-extension-httpfs==1.5.5   # for tables on S3
    python examples/read_duckdb.py --config examples/quickstart.toml shop.orders

The extensions come from PyPI wheels of the same version as DuckDB and are loaded from
where those wheels put them, so nothing is downloaded at run time (``INSTALL`` is not
needed). The catalog gives the table's current metadata file; ``iceberg_scan`` reads
it, applying the position-delete files sparkapply writes for updates and deletes. A
table on S3 is read with an S3 secret made of the catalog's own ``s3.*`` properties
(the table's ``io.properties``), so DuckDB reads the store sparkapply writes to.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
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


def connect(s3: Mapping[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """DuckDB with the iceberg extension; with ``s3`` (FileIO properties), httpfs and
    an S3 secret made of them too."""
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    names = ("httpfs", "avro", "iceberg") if s3 is not None else ("avro", "iceberg")
    for name in names:  # iceberg reads its manifests with avro
        con.execute(f"LOAD '{extension_file(name)}'")
    if s3 is not None:
        create_s3_secret(con, s3)
    return con


def create_s3_secret(con: duckdb.DuckDBPyConnection, props: Mapping[str, str]) -> None:
    """DuckDB's S3 secret for pyiceberg's ``s3.*`` properties (endpoint, keys, region,
    path style); what is not set is left to DuckDB's defaults."""
    options = {
        "KEY_ID": props.get("s3.access-key-id"),
        "SECRET": props.get("s3.secret-access-key"),
        "SESSION_TOKEN": props.get("s3.session-token"),
        "REGION": props.get("s3.region") or ("us-east-1" if "s3.endpoint" in props else None),
    }
    endpoint = props.get("s3.endpoint")
    if endpoint:
        parsed = urlparse(endpoint)
        options["ENDPOINT"] = parsed.netloc or parsed.path
        options["USE_SSL"] = "false" if parsed.scheme == "http" else "true"
    if props.get("s3.force-virtual-addressing", "").lower() == "false":
        options["URL_STYLE"] = "path"
    given = {k: v for k, v in options.items() if v}
    quoted = ", ".join(
        f"{k} {v}" if v in ("true", "false") else f"{k} '{v.replace(chr(39), chr(39) * 2)}'"
        for k, v in given.items()
    )
    con.execute(f"CREATE SECRET sparkapply_s3 (TYPE s3, {quoted})")


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

    table = open_catalog(args.config).load_table(table_name(args.table, args.config))
    on_s3 = urlparse(table.metadata_location).scheme in ("s3", "s3a", "s3n")
    con = connect(
        {k: v for k, v in table.io.properties.items() if isinstance(v, str)} if on_s3 else None
    )
    metadata = local_path(table.metadata_location)
    count = con.execute("SELECT count(*) FROM iceberg_scan(?)", [metadata]).fetchone()
    print(f"rows: {count[0] if count else 0}")
    result = con.execute("SELECT * FROM iceberg_scan(?)", [metadata])
    columns = [d[0] for d in result.description]
    print_rows(columns, result.fetchall(), args.limit)


if __name__ == "__main__":
    main()
