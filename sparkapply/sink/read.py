"""Reading the mirror back (not the apply path): a table's rows, and which snapshot of
each table to read so that the tables agree with each other (the newest cut).

Each batch records a cut (``sparkapply/sink/cuts.py``): the LSN of its last source
transaction and, for every mirrored table, the Iceberg snapshot holding exactly the
transactions up to it. Read one cut, then every table at its snapshot id, and the
tables agree with each other as they did on the publisher::

    from pyiceberg.catalog import load_catalog
    from sparkapply.sink.read import cut_snapshots

    catalog = load_catalog("sparkapply", type="sql", uri=..., warehouse=...)
    ids = cut_snapshots(catalog)  # {"public.orders": 4417..., "public.order_lines": ...}
    orders = catalog.load_table("public.orders").scan(snapshot_id=ids["public.orders"])

Tables are named ``<pg schema>.<pg table>``; :func:`latest_cut` also says which Iceberg
table each is (``[sink.tables]`` may rename them). Cuts of the last minute (at most
the newest 120), and the last cut of each minute before that (up to ``[maintenance]
retain_seconds``), and the newest however old, are kept, and expiry keeps every
snapshot they name. A cut at an exact LSN is asked of the running mirror by
``sparkapply cut --at-lsn`` (``sparkapply/commands/cut.py``).
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from sparkapply.errors import CutError
from sparkapply.lsn import Lsn
from sparkapply.sink.cuts import DEFAULT_CUTS_TABLE, Cut, cuts_identifier, read_cuts

__all__ = ["Cut", "cut_snapshots", "latest_cut", "read_table"]


def read_table(table: Table, *, snapshot_id: int | None = None) -> pa.Table:
    """The table's rows at its current snapshot (or ``snapshot_id``), all in memory.

    Columns are resolved by field id (files written before sparkapply wrote ids,
    through the table's name mapping), and columns added after a file was written
    read as null, as in every engine.
    """
    # Not ``to_arrow()``: with no row left it makes ``schema.empty_table()``, which
    # pyarrow cannot for a list of uuid; the reader's empty result has the schema.
    return table.scan(snapshot_id=snapshot_id).to_arrow_batch_reader().read_all()


def latest_cut(
    catalog: Catalog, *, lsn: str | int | None = None, cuts_table: str = DEFAULT_CUTS_TABLE
) -> Cut:
    """The newest cut (at or before ``lsn``, as ``"0/3A1C2F8"`` or an integer, if
    given). Raises :class:`~sparkapply.errors.CutError` when there is none."""
    ident = cuts_identifier(cuts_table)
    at_most = None if lsn is None else Lsn(lsn)
    if not catalog.table_exists(ident):
        raise CutError(
            f"there is no cuts table {cuts_table} in the catalog",
            hint="cuts are recorded by `sparkapply run` (from its initial copy on) with "
            "[sink] cuts_table set (the default)",
        )
    cuts = read_cuts(catalog.load_table(ident), at_most=at_most)
    if not cuts:
        where = f" at or before {at_most}" if at_most is not None else ""
        raise CutError(
            f"no cut{where} in {cuts_table}",
            hint="cuts older than [maintenance] retain_seconds are pruned; a cut exists "
            "once `sparkapply run` has copied the tables",
        )
    return cuts[-1]


def cut_snapshots(
    catalog: Catalog, *, lsn: str | int | None = None, cuts_table: str = DEFAULT_CUTS_TABLE
) -> dict[str, int]:
    """``{"<pg schema>.<pg table>": snapshot_id}`` of the newest cut (at or before
    ``lsn``): read each table at its snapshot id for a consistent database."""
    return dict(latest_cut(catalog, lsn=lsn, cuts_table=cuts_table).tables)
