"""Read a mirrored table with pyiceberg (what sparkapply itself writes with).

    python examples/read_pyiceberg.py --config examples/quickstart.toml shop.orders

Prints the row count, then the first rows (sorted). Position deletes are applied by
pyiceberg's scan, so what you see is the table as of its last applied transaction; the
snapshot summary says which one (``sparkapply.lsn``).
"""

from __future__ import annotations

import argparse

from _catalog import open_catalog, print_rows, table_name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the sparkapply config file")
    p.add_argument("table", help="schema.table")
    p.add_argument("--limit", type=int, default=10, help="rows to print")
    args = p.parse_args()

    table = open_catalog(args.config).load_table(table_name(args.table, args.config))
    snapshot = table.current_snapshot()
    lsn = snapshot.summary.additional_properties.get("sparkapply.lsn") if snapshot else None
    arrow = table.scan().to_arrow()
    print(f"rows: {arrow.num_rows}  applied up to LSN: {lsn}")
    print_rows(arrow.column_names, [tuple(r.values()) for r in arrow.to_pylist()], args.limit)


if __name__ == "__main__":
    main()
