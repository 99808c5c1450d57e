"""``sparkapply cut``: the newest cut, a cut at an exact LSN, and the tags on a cut.

A cut is made by the running mirror, never here: ``--at-lsn X`` leaves a request under
``work_dir`` (``changes/cut_requests.py``) that the running ``sparkapply run``, or the
next one, serves by ending a batch at X, and waits for the cut to appear in the cuts
table. Reading cuts is :mod:`sparkapply.sink.read`'s; tagging is ``sink/cuts.py``'s.
"""

from __future__ import annotations

import json
import logging
import time

from pyiceberg.catalog import Catalog

from sparkapply.changes.cut_requests import CutRequests
from sparkapply.config import Config
from sparkapply.errors import ConfigError, CutError, CutPassedError
from sparkapply.lsn import Lsn
from sparkapply.sink.atomic import atomic_commits
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.cuts import Cut, cuts_identifier, read_cuts, tag_cut, untag
from sparkapply.sink.read import latest_cut

log = logging.getLogger(__name__)


def run_cut(
    config: Config,
    lsn: str | None = None,
    at_lsn: str | None = None,
    *,
    timeout: float = 60.0,
    tag: str | None = None,
    as_json: bool = False,
) -> int:
    """Print the newest cut (at or before ``lsn``), or the cut at exactly ``at_lsn``
    (asked of the mirror, waiting up to ``timeout`` seconds), and tag every table at it
    as ``tag`` if given. The exit code."""
    _require_cuts(config)
    at_most = _lsn_argument(lsn, "--lsn")
    exact = _lsn_argument(at_lsn, "--at-lsn")
    catalog, atomic = _open(config)
    if exact is not None:
        cut = wait_for_cut(config, exact, timeout=timeout)
    else:
        cut = latest_cut(catalog, lsn=at_most, cuts_table=config.sink.cuts_table)
    if tag is not None:
        tagged = tag_cut(catalog, cut, tag, atomic=atomic)
        log.info("tagged %d tables %s at the cut at %s", len(tagged), tag, cut.lsn)
    print(json.dumps(cut.as_json()) if as_json else _render(cut))
    return 0


def untag_cut(config: Config, name: str, *, tag: str | None = None) -> int:
    """Remove the tag ``name`` from every table of the newest cut (``tag``, the other
    option, may not be given with it). The exit code."""
    _require_cuts(config)
    catalog, atomic = _open(config)
    if tag is not None:
        raise ConfigError("--tag and --untag exclude each other", key="--untag")
    newest = latest_cut(catalog, cuts_table=config.sink.cuts_table)
    done = untag(catalog, name, newest.iceberg.values(), atomic=atomic)
    log.info("removed tag %s from %d tables", name, len(done))
    return 0


def _require_cuts(config: Config) -> None:
    if not config.sink.cuts_table:
        raise ConfigError("no cuts are recorded: [sink] cuts_table is empty", key="sink.cuts_table")


def _open(config: Config) -> tuple[Catalog, bool]:
    """The catalog, and whether it commits several tables atomically (tags then move
    together)."""
    catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    return catalog, config.sink.atomic_commit and atomic_commits(catalog)


def _render(cut: Cut) -> str:
    committed = cut.committed_at.isoformat() if cut.committed_at else "unknown"
    lines = [f"cut at LSN {cut.lsn}, committed on the publisher at {committed}"]
    width = max((len(t) for t in cut.tables), default=5)
    for table, snapshot_id in sorted(cut.tables.items()):
        lines.append(
            f"  {table:<{width}}  snapshot {snapshot_id}  ({cut.iceberg.get(table, table)})"
        )
    return "\n".join(lines)


def _lsn_argument(value: str | None, option: str) -> Lsn | None:
    if value is None:
        return None
    try:
        return Lsn(value)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}", key=option) from None


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
