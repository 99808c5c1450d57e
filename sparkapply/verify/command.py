"""``sparkapply verify``: does the mirror equal the publisher at one exact LSN?

1. A temporary slot's exported snapshot fixes a point C on the publisher; every
   published table is hashed there by the server (``publisher.py``).
2. The mirror's cut at C - 1 (as ``sparkapply cut --at-lsn`` asks for it: made by
   the running ``run``, or, when none runs, by the subscriber run here until it is,
   within ``timeout``: ``run/exact_cut.py``) says which snapshot of each
   table holds exactly the same transactions, every commit below C (a commit record
   may start at C itself, and the snapshot does not see it); Spark tasks hash those
   (``mirror.py``).
3. Per table: rows and the order-independent hash (``canonical.py``). When they
   differ, the buckets whose sums differ are read on both sides and their rows
   matched by key: keys missing in Iceberg, extra in Iceberg, or different (which
   columns); for a table without a key, the row images whose count differs. A row
   falls in a bucket by its own hash, not its key's: one hash per row, not two, and a
   changed row's two images land in two buckets that both differ, so both are read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pyiceberg.catalog import Catalog

from sparkapply.changes.cut_requests import HOLD_SETTLE, CutRequests
from sparkapply.config import Config
from sparkapply.convert.types import PgColumnType, column_target
from sparkapply.copy.snapshot import SourceTable, describe_tables
from sparkapply.errors import ConfigError, CutPassedError
from sparkapply.lsn import Lsn
from sparkapply.run.exact_cut import bring_to_cut
from sparkapply.state.verdict import record_verify
from sparkapply.verify.canonical import NULL
from sparkapply.verify.mirror import Buckets, RowTexts, Shape, mirror_rows, mirror_sums
from sparkapply.verify.publisher import (
    ExactPoint,
    check_hash,
    exact_point,
    publisher_rows,
    publisher_sums,
    total,
)

log = logging.getLogger(__name__)

BUCKETS = 64
ATTEMPTS = 3  # points tried when the live mirror passed one before it was asked
# How long the live mirror may hold its apply while verify's slot becomes consistent
# (it waits for the publisher's running transactions); past it the mirror goes on.
HOLD_SECONDS = 60.0

Kind = Literal["missing in Iceberg", "extra in Iceberg", "different"]


@dataclass(frozen=True, slots=True)
class Difference:
    kind: Kind
    row: str  # the key (``id=5``) or, for a table without a key, the row image
    columns: tuple[str, ...] = ()  # "different": the columns whose values differ
    count: int = 1  # a row image: how many more on one side


@dataclass(slots=True)
class TableVerdict:
    table: str  # <pg schema>.<pg table>
    iceberg: str
    snapshot_id: int | None
    publisher_rows: int
    iceberg_rows: int | None
    publisher_hash: int
    iceberg_hash: int | None
    differences: list[Difference] = field(default_factory=list)  # the first --max-rows
    differing: int = 0  # every difference found (``differences`` lists the first few)
    note: str = ""

    @property
    def match(self) -> bool:
        return (
            self.iceberg_rows == self.publisher_rows
            and self.iceberg_hash == self.publisher_hash
            and not self.differences
            and not self.note
        )


@dataclass(slots=True)
class VerifyReport:
    lsn: Lsn
    tables: list[TableVerdict]

    @property
    def match(self) -> bool:
        return all(t.match for t in self.tables)

    def as_json(self) -> str:
        out: dict[str, Any] = {"lsn": str(self.lsn), "match": self.match, "tables": []}
        for t in self.tables:
            entry = asdict(t)
            entry["match"] = t.match
            entry["publisher_hash"] = f"{t.publisher_hash:016x}"
            entry["iceberg_hash"] = None if t.iceberg_hash is None else f"{t.iceberg_hash:016x}"
            out["tables"].append(entry)
        return json.dumps(out)

    def render(self) -> str:
        rows = [("table", "publisher rows", "iceberg rows", "hash", "differences")]
        for t in self.tables:
            rows.append(
                (
                    t.table,
                    f"{t.publisher_rows:,}",
                    "-" if t.iceberg_rows is None else f"{t.iceberg_rows:,}",
                    "match" if t.iceberg_hash == t.publisher_hash else "DIFFERS",
                    t.note or f"{t.differing:,}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        for t in self.tables:
            for d in t.differences:
                what = f" ({', '.join(d.columns)})" if d.columns else ""
                times = f" x{d.count}" if d.count != 1 else ""
                lines.append(f"  {t.table}: {d.kind}: {d.row}{what}{times}")
            if t.differing > len(t.differences):
                more = t.differing - len(t.differences)
                lines.append(f"  {t.table}: ... and {more:,} more (--max-rows shows more)")
        bad = [t.table for t in self.tables if not t.match]
        verdict = (
            f"MATCH: {len(self.tables)} tables equal the publisher at {self.lsn}"
            if not bad
            else f"DIFFERS at {self.lsn}: {', '.join(bad)}"
        )
        return "\n".join([*lines, verdict])


def shape_of(source: SourceTable, buckets: int = BUCKETS) -> Shape:
    rel = source.relation
    columns = tuple(
        (c.name, column_target(PgColumnType(c.type_oid, c.type_modifier))) for c in rel.columns
    )
    keyed = rel.replica_identity in ("d", "i")
    key = tuple(c.name for c in rel.columns if c.is_key) if keyed else ()
    return Shape(columns, key, buckets)


def run_verify(
    config: Config,
    *,
    tables: Sequence[str] = (),
    timeout: float = 300.0,
    max_rows: int = 20,
    spark: Any = None,
    catalog: Catalog | None = None,
) -> VerifyReport:
    """Compare every published table (or ``tables``, as ``schema.table``) with the
    mirror at one exact LSN; see the module doc."""
    if not config.sink.cuts_table:
        raise ConfigError(
            "verify reads the mirror at a cut, and [sink] cuts_table is empty",
            key="sink.cuts_table",
            hint="set [sink] cuts_table (default sparkapply.cuts) and run `sparkapply run`",
        )
    if catalog is None:
        from sparkapply.sink.catalog import open_catalog

        catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    only = [_split(t) for t in tables] or None
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with _requested_point(config) as point:
                report = _compare(config, only, timeout, max_rows, spark, catalog, point)
            bad = [t.table for t in report.tables if not t.match]
            record_verify(config.work_dir, lsn=str(report.lsn), match=report.match, differing=bad)
            return report
        except CutPassedError as exc:
            if attempt == ATTEMPTS:
                raise
            log.info("%s; verifying again at a new point (attempt %d)", exc.message, attempt + 1)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _requested_point(config: Config) -> Iterator[ExactPoint]:
    """An exact point on the publisher, whose cut is asked of the mirror before it can
    pass it: a hold at the publisher's position while the slot becomes consistent
    (see :mod:`sparkapply.changes.cut_requests`), then the request at the point."""
    requests = CutRequests(config.work_dir)
    holds: list[tuple[Path, Lsn, float]] = []  # (file, floor, when)

    def hold(floor: Lsn) -> None:
        holds.append((requests.hold(floor, HOLD_SECONDS), floor, time.monotonic()))
        time.sleep(HOLD_SETTLE)

    try:
        with exact_point(config, before=hold) as point:
            requests.add(point.cut_lsn)
            for path, floor, since in holds:
                requests.release(path)
                log.info(
                    "the mirror was held above %s for %.2fs while the point was fixed",
                    floor,
                    time.monotonic() - since,
                )
            yield point
    finally:
        for path, _, _ in holds:
            requests.release(path)


def _compare(
    config: Config,
    only: list[tuple[str, str]] | None,
    timeout: float,
    max_rows: int,
    spark: Any,
    catalog: Catalog,
    point: ExactPoint,
) -> VerifyReport:
    sources = describe_tables(point.conn, config.source.publication, only)
    missing = sorted(set(only or ()) - {s.key for s in sources})
    if missing:
        raise ConfigError(
            f"not published: {', '.join('.'.join(m) for m in missing)}",
            key="--table",
            hint="name tables of the publication, as schema.table",
        )
    shapes = {s.key: shape_of(s) for s in sources}
    check_hash(point.conn)
    # The two sides at once: the server hashes its tables while the mirror's cut
    # is awaited, Spark starts and its tasks hash the mirror's.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-publisher")
    future = pool.submit(
        lambda: {s.key: publisher_sums(point.conn, s, shapes[s.key]) for s in sources}
    )
    try:
        if spark is None:
            from sparkapply.apply.session import get_session

            spark = get_session(config.spark.master, config.spark.app_name, config.spark.conf)
        log.info(
            "verifying at %s: up to %gs for the mirror's cut at %s (every commit below it)",
            point.lsn,
            timeout,
            point.cut_lsn,
        )
        cut = bring_to_cut(config, point.cut_lsn, timeout=timeout, spark=spark, catalog=catalog)
        ice = _mirror_side(config, catalog, spark, cut.tables, sources, shapes)
        pg = future.result()
    except BaseException:
        if not future.done():
            point.conn.cancel_safe()  # the query, or the pool would wait for it
        raise
    finally:
        pool.shutdown(wait=True)
    verdicts = []
    for source in sources:
        shape = shapes[source.key]
        rows, digest = total(pg[source.key])
        verdict = TableVerdict(
            source.qualified,
            ".".join(config.table_identifier(*source.key)),
            cut.tables.get(source.qualified),
            rows,
            None,
            digest,
            None,
        )
        verdicts.append(verdict)
        if source.key not in ice:
            verdict.note = "not in the mirror at this cut"
            continue
        verdict.iceberg_rows, verdict.iceberg_hash = total(ice[source.key])
        if verdict.iceberg_rows == rows and verdict.iceberg_hash == digest:
            continue
        wanted = _differing(pg[source.key], ice[source.key])
        theirs = publisher_rows(point.conn, source, shape, wanted)
        table = catalog.load_table(config.table_identifier(*source.key))
        assert verdict.snapshot_id is not None
        ours = mirror_rows(spark, table, verdict.snapshot_id, shape, frozenset(wanted))
        found = _differences(shape, theirs, ours)
        verdict.differences, verdict.differing = found[:max_rows], len(found)
    return VerifyReport(point.lsn, verdicts)


def _mirror_side(
    config: Config,
    catalog: Catalog,
    spark: Any,
    cut_tables: Mapping[str, int],
    sources: Sequence[SourceTable],
    shapes: Mapping[tuple[str, str], Shape],
) -> dict[tuple[str, str], Buckets]:
    """Each table's sums at the cut (tables the cut does not name are left out)."""
    out = {}
    for source in sources:
        snapshot_id = cut_tables.get(source.qualified)
        if snapshot_id is not None:
            table = catalog.load_table(config.table_identifier(*source.key))
            out[source.key] = mirror_sums(spark, table, snapshot_id, shapes[source.key])
    return out


def _differing(a: Buckets, b: Buckets) -> list[int]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _split(name: str) -> tuple[str, str]:
    schema, _, table = name.partition(".")
    if not schema or not table:
        raise ConfigError(f"--table {name!r} must be schema.table", key="--table")
    return schema, table


def _differences(
    shape: Shape, theirs: Sequence[RowTexts], ours: Sequence[RowTexts]
) -> list[Difference]:
    """Every difference between the rows of the differing buckets, in key order."""
    names = [n for n, _ in shape.columns]
    out: list[Difference] = []
    if not shape.key:  # row images, by multiplicity
        want, have = Counter(r.row for r in theirs), Counter(r.row for r in ours)
        show = {r.row: _image(names, r.values) for r in [*theirs, *ours]}
        for row in sorted(set(want) | set(have)):
            delta = want[row] - have[row]
            if delta > 0:
                out.append(Difference("missing in Iceberg", show[row], count=delta))
            elif delta < 0:
                out.append(Difference("extra in Iceberg", show[row], count=-delta))
        return out
    key_at = [names.index(k) for k in shape.key]
    by_key_pg = {r.key: r for r in theirs}
    by_key_ice: dict[str, list[RowTexts]] = {}
    for r in ours:
        by_key_ice.setdefault(r.key, []).append(r)
    for key in sorted(set(by_key_pg) | set(by_key_ice)):
        pg_row, ice_rows = by_key_pg.get(key), by_key_ice.get(key, [])
        sample = pg_row or ice_rows[0]
        shown = ", ".join(f"{names[i]}={_value(sample.values[i])}" for i in key_at)
        if pg_row is None:
            out.append(Difference("extra in Iceberg", shown, count=len(ice_rows)))
            continue
        if not ice_rows:
            out.append(Difference("missing in Iceberg", shown))
            continue
        if len(ice_rows) > 1:
            out.append(Difference("extra in Iceberg", shown, count=len(ice_rows) - 1))
        ice_row = ice_rows[0]
        if ice_row.row != pg_row.row:
            cols = tuple(
                n for n, a, b in zip(names, pg_row.values, ice_row.values, strict=True) if a != b
            )
            out.append(Difference("different", shown, cols))
    return out


def _value(text: str | None) -> str:
    return "null" if text is None or text == NULL else repr(text)


def _image(names: Sequence[str], values: Sequence[str | None]) -> str:
    return "(" + ", ".join(f"{n}={_value(v)}" for n, v in zip(names, values, strict=True)) + ")"
