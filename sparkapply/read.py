"""Reading the mirror as one database: which snapshot of each table to read.

Each batch records a cut (``sparkapply/sink/cuts.py``): the LSN of its last source
transaction and, for every mirrored table, the Iceberg snapshot holding exactly the
transactions up to it. Read one cut, then every table at its snapshot id, and the
tables agree with each other as they did on the publisher::

    from pyiceberg.catalog import load_catalog
    from sparkapply.read import cut_snapshots

    catalog = load_catalog("sparkapply", type="sql", uri=..., warehouse=...)
    ids = cut_snapshots(catalog)  # {"public.orders": 4417..., "public.order_lines": ...}
    orders = catalog.load_table("public.orders").scan(snapshot_id=ids["public.orders"])

Tables are named ``<pg schema>.<pg table>``; :func:`latest_cut` also says which Iceberg
table each is (``[sink.tables]`` may rename them). Cuts of the last minute, and
the last cut of each minute before that (up to ``[maintenance] retain_seconds``), are
kept, and expiry keeps every snapshot they name.
"""

from __future__ import annotations

import time

from pyiceberg.catalog import Catalog

from sparkapply.changes.cut_requests import CutRequests
from sparkapply.config import Config
from sparkapply.errors import CutError, CutPassedError
from sparkapply.lsn import Lsn
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.cuts import DEFAULT_CUTS_TABLE, Cut, cuts_identifier, read_cuts

__all__ = ["Cut", "cut_snapshots", "latest_cut", "wait_for_cut"]


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
            hint="cuts are recorded by `sparkapply run` (after its first batch) with "
            "[sink] cuts_table set (the default)",
        )
    cuts = read_cuts(catalog.load_table(ident), at_most=at_most)
    if not cuts:
        where = f" at or before {at_most}" if at_most is not None else ""
        raise CutError(
            f"no cut{where} in {cuts_table}",
            hint="cuts older than [maintenance] retain_seconds are pruned; a cut exists "
            "once `sparkapply run` has applied a batch",
        )
    return cuts[-1]


def cut_snapshots(
    catalog: Catalog, *, lsn: str | int | None = None, cuts_table: str = DEFAULT_CUTS_TABLE
) -> dict[str, int]:
    """``{"<pg schema>.<pg table>": snapshot_id}`` of the newest cut (at or before
    ``lsn``): read each table at its snapshot id for a consistent database."""
    return dict(latest_cut(catalog, lsn=lsn, cuts_table=cuts_table).tables)


def wait_for_cut(config: Config, lsn: Lsn, *, timeout: float, poll: float = 0.25) -> Cut:
    """The cut at exactly ``lsn``: asks the mirror to make it (a file under
    ``work_dir``, served by the running ``sparkapply run`` or the next one) and waits
    up to ``timeout`` seconds. Raises :class:`~sparkapply.errors.CutError` when it
    does not come, or cannot (the mirror is already past ``lsn``)."""
    catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    ident = cuts_identifier(config.sink.cuts_table)
    found = _exact(catalog, ident, lsn)
    if found is not None:
        return found
    requests = CutRequests(config.work_dir, interval=0.0)
    requests.add(lsn)
    deadline = time.monotonic() + timeout
    while True:
        found = _exact(catalog, ident, lsn)
        if found is not None:
            return found
        if lsn not in requests.pending():  # served, or dropped if there is no cut
            found = _exact(catalog, ident, lsn)
            if found is not None:
                return found
            raise CutPassedError(
                f"no cut can be made at exactly {lsn}: the mirror already holds "
                "transactions after it",
                lsn=lsn,
                hint=f"`sparkapply cut --lsn {lsn}` gives the newest cut at or before it",
            )
        if time.monotonic() >= deadline:
            raise CutError(
                f"no cut at {lsn} after {timeout:g}s: `sparkapply run` is not running, or "
                "has not reached that LSN yet",
                lsn=lsn,
                hint="the request stays under work_dir/cut-requests; a later run makes "
                "the cut (run this again to wait for it), or remove the file to cancel",
            )
        time.sleep(poll)


def _exact(catalog: Catalog, ident: tuple[str, str], lsn: Lsn) -> Cut | None:
    if not catalog.table_exists(ident):
        return None
    cuts = read_cuts(catalog.load_table(ident), at_most=lsn)
    return cuts[-1] if cuts and cuts[-1].lsn == lsn else None
