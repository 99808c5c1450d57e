"""``sparkapply cut``: the newest cut, a cut at an exact LSN, and the tags on a cut.

A cut is made by the running mirror, never here: ``--at-lsn X`` leaves a request under
``work_dir`` (``changes/cut_requests.py``) that the running ``sparkapply run``, or the
next one, serves by ending a batch at X, and waits for the cut to appear in the cuts
table (``run/exact_cut.py``). Reading cuts is :mod:`sparkapply.sink.read`'s; tagging
is ``sink/cuts.py``'s.
"""

from __future__ import annotations

import json
import logging

from pyiceberg.catalog import Catalog

from sparkapply.config import Config
from sparkapply.errors import ConfigError
from sparkapply.lsn import Lsn
from sparkapply.run.exact_cut import wait_for_cut
from sparkapply.sink.atomic import atomic_commits
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.cuts import Cut, tag_cut, untag
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
    print(json.dumps(_json(catalog, cut)) if as_json else _render(cut))
    return 0


def _json(catalog: Catalog, cut: Cut) -> dict[str, object]:
    """The cut, with where each table is: its Iceberg name and the metadata file that
    holds its snapshot (a reader by path, such as DuckDB's ``iceberg_scan``, needs it).
    The current metadata lists every retained snapshot, the cut's among them."""
    doc = cut.as_json()
    doc["iceberg"] = dict(sorted(cut.iceberg.items()))
    doc["metadata_locations"] = {
        name: catalog.load_table(tuple(ident.split(".", 1))).metadata_location
        for name, ident in sorted(cut.iceberg.items())
    }
    return doc


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
