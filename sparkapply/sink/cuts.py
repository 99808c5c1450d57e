"""Cuts: what a reader pins to see the mirror as one database.

A cut is a point in the publisher's history, the commit LSN of a batch's last source
transaction, with, for every mirrored table, the Iceberg snapshot that holds exactly
the transactions up to that LSN. A reader who reads one cut and then each table at
its snapshot id sees the tables as they were together on the publisher: an order and
its lines, both or neither.

WHERE CUTS LIVE

In an Iceberg table of their own (``[sink] cuts_table``, default ``sparkapply.cuts``),
one row per table per cut, so any engine can read them with SQL::

    SELECT source_table, snapshot_id FROM sparkapply.cuts
    WHERE lsn = (SELECT max(lsn) FROM sparkapply.cuts)

The apply appends a batch's cut in the batch's own catalog transaction
(``atomic.py``): a reader never finds a cut whose snapshots are not committed, nor a
committed batch without its cut. With a catalog that commits table by table, the cut
is committed after every table of the batch. The initial copy records the first cut
the same way, with the tables it copied; a later copy asks the stream for its cut
(``copy/commit.py``).

WHICH TABLES A CUT NAMES

Every table the mirror knows whose applied LSN is at most the cut's LSN: a table the
batch did not touch holds exactly the transactions up to the cut (none of the later
ones touched it). A table copied at a point past the cut (a table added to the
publication while the stream is behind) is left out until the stream passes it.

ONE PUBLISHER A CUTS TABLE

Cuts are ordered by LSN, and LSNs of two publishers (two servers, or two databases of
one) say nothing of each other: "the latest cut" of a table two subscribers wrote to
would be either's. So the table records whose cuts it holds (the table property
:data:`SOURCE_PROPERTY`: the publisher's system identifier and database), and a
subscriber of another refuses to start on it; each needs its own ``cuts_table``.

WHICH CUTS ARE KEPT, AND WHAT THEY PROTECT

Every cut of the last :data:`DENSE_SECONDS`, up to the newest :data:`DENSE_CUTS` of
them; before that, the last cut of each minute (and every cut asked for by LSN), up to
``[maintenance] retain_seconds``; the newest cut always, however old. Expiry never
removes a snapshot a kept cut names (:meth:`CutLog.protected`, and
:func:`protected_snapshots` for ``sparkapply maintain``), nor a tagged one (a head),
so a kept cut can always be read;
thinning keeps that from holding one snapshot per batch for an hour (a table's
metadata, rewritten at every commit, grows with its snapshots). A reader has a cut's
snapshots for a minute, or for :data:`DENSE_CUTS` batches when they come faster (15 s
at eight a second); to read one longer, tag it. The cuts table is rewritten to the
kept cuts when it has more than :data:`MAX_FILES` data files.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemoveSnapshotRefUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)
from pyiceberg.types import BooleanType, LongType, NestedField, StringType, TimestamptzType

from sparkapply import location
from sparkapply.datafiles import arrow_schema_of, data_directory
from sparkapply.errors import CommitConflictError, ConfigError, CutError, SinkError
from sparkapply.lsn import Lsn
from sparkapply.sink.atomic import commit_together
from sparkapply.sink.commit import StagedSnapshot, commit_files, commit_staged, stage_files
from sparkapply.sink.files import current_snapshot_id
from sparkapply.sink.producer import StagedChange
from sparkapply.sink.progress import applied_lsn
from sparkapply.sink.tables import TableIdentifier, ensure_table, table_name
from sparkapply.storage import Storage

logger = logging.getLogger(__name__)

DEFAULT_CUTS_TABLE = "sparkapply.cuts"
SOURCE_PROPERTY = "sparkapply.source"
"""Cuts table property: the publisher whose cuts it holds (see ONE PUBLISHER A CUTS TABLE)."""
# Every cut younger than this is kept, up to the newest DENSE_CUTS of them. Each kept
# cut keeps a snapshot of every hot table, and a table's metadata (rewritten at each
# commit, read at each load) grows with its snapshots: at two batches a second a minute
# is 120 of them, about what the apply's own expiry keeps anyway ([sink]
# retain_snapshots). Small batches now come eight a second at 300 pgbench transactions
# a second: a minute of them was 480 snapshots a table, 400 kB of metadata written per
# table and batch, and the mirror twice as stale at 1,000 tps after it (bench/README.md).
DENSE_SECONDS = 60.0
DENSE_CUTS = 120
THIN_SECONDS = 60.0  # older ones: the last of each such interval
MAX_FILES = 64  # the cuts table is rewritten to the kept cuts beyond this

CUTS_SCHEMA = Schema(
    NestedField(1, "lsn", LongType(), required=True),
    NestedField(2, "pg_lsn", StringType(), required=True),
    NestedField(3, "committed_at", TimestamptzType(), required=False),
    NestedField(4, "recorded_at", TimestamptzType(), required=True),
    NestedField(5, "requested", BooleanType(), required=True),
    NestedField(6, "source_table", StringType(), required=True),
    NestedField(7, "iceberg_table", StringType(), required=True),
    NestedField(8, "snapshot_id", LongType(), required=True),
)


@dataclass(frozen=True, slots=True)
class Cut:
    """One cut: ``tables`` maps ``<pg schema>.<pg table>`` to an Iceberg snapshot id,
    ``iceberg`` the same names to the Iceberg tables (``namespace.table``)."""

    lsn: Lsn
    committed_at: dt.datetime | None
    recorded_at: dt.datetime
    tables: dict[str, int]
    iceberg: dict[str, str] = field(default_factory=dict)
    requested: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "lsn": str(self.lsn),
            "committed_at": self.committed_at.isoformat() if self.committed_at else None,
            "tables": dict(sorted(self.tables.items())),
        }


def cuts_identifier(name: str) -> TableIdentifier:
    namespace, _, table = name.rpartition(".")
    if not namespace or not table:
        raise SinkError(
            f"the cuts table {name!r} must be named 'namespace.table'", key="sink.cuts_table"
        )
    return namespace, table


def kept(cuts: Sequence[Cut], now: dt.datetime, retain_seconds: float) -> list[Cut]:
    """The cuts to keep of ``cuts`` (see the module doc), in LSN order."""
    if not cuts:
        return []
    ordered = sorted(cuts, key=lambda c: c.lsn)
    newest = ordered[-1]
    dense_from = now - dt.timedelta(seconds=DENSE_SECONDS)
    recent = [c for c in ordered if c.recorded_at >= dense_from]
    if len(recent) > DENSE_CUTS:  # more than DENSE_CUTS a minute: the newest of them
        dense_from = recent[-DENSE_CUTS].recorded_at
    retain_from = now - dt.timedelta(seconds=retain_seconds)
    last_of_interval: dict[int, Cut] = {}
    for cut in ordered:
        if retain_from <= cut.recorded_at < dense_from:
            last_of_interval[int(cut.recorded_at.timestamp() // THIN_SECONDS)] = cut
    keep = {id(c) for c in last_of_interval.values()}
    return [
        c
        for c in ordered
        if c is newest
        or c.recorded_at >= dense_from
        or (c.recorded_at >= retain_from and (c.requested or id(c) in keep))
    ]


@dataclass(slots=True)
class _TableState:
    iceberg: TableIdentifier
    snapshot_id: int | None
    applied: Lsn


def claim_cuts_table(catalog: Catalog, identifier: TableIdentifier, source: str) -> None:
    """Create the cuts table if missing and record ``source`` (``system <id>, database
    <name>``) as the publisher whose cuts it holds; refuse one that holds another's
    (see ONE PUBLISHER A CUTS TABLE)."""
    table = ensure_table(catalog, identifier, CUTS_SCHEMA)
    held = table.properties.get(SOURCE_PROPERTY)
    if held == source:
        return
    if held is not None:
        raise ConfigError(
            f"the cuts table {'.'.join(identifier)} holds the cuts of another publisher "
            f"({held}), not of this one ({source}): the LSNs of two publishers cannot be "
            "ordered",
            key="sink.cuts_table",
            hint="give each subscriber its own [sink] cuts_table (e.g. "
            f"{identifier[0]}.cuts_<database>); if this is the same database moved to a "
            "new server (pg_upgrade), drop the cuts table and the next run records cuts "
            "afresh",
        )
    with table.transaction() as txn:
        txn.set_properties({SOURCE_PROPERTY: source})


class CutLog:
    """The apply's record of cuts: stages a batch's cut, keeps the kept cuts in memory
    for :meth:`protected`, and rewrites the cuts table when it has grown."""

    def __init__(
        self,
        catalog: Catalog,
        identifier: TableIdentifier,
        *,
        retain_seconds: float,
        source_names: Callable[[TableIdentifier], str] | None = None,
    ) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self.retain_seconds = retain_seconds
        self._source_name = source_names or (lambda ident: ".".join(ident))
        self._states: dict[str, _TableState] = {}  # by source table name
        self._stale: set[TableIdentifier] = set()
        self._reload = False  # maintenance committed to the cuts table itself
        self._guard = threading.Lock()  # _cuts and _stale: read by maintenance's thread
        self.table = ensure_table(catalog, identifier, CUTS_SCHEMA)
        self._cuts = kept_cuts(self.table, retain_seconds)

    # -- what the mirror holds ----------------------------------------------------------

    def track(self, idents: Iterable[TableIdentifier]) -> None:
        """Tables the mirror holds (the published ones at start): named by every cut
        from now on, at their current snapshot, once their applied LSN is reached."""
        for ident in idents:
            name = self._source_name(ident)
            if name not in self._states:
                self._load(name, ident)

    def changed(self, ident: TableIdentifier) -> None:
        """Another writer (a copy, maintenance) committed to ``ident``: the next cut
        reads its current snapshot again; for the cuts table itself (maintenance's
        expiry), the next cut is staged on its new metadata. Thread-safe."""
        with self._guard:
            if tuple(ident) == tuple(self.identifier):
                self._reload = True
            else:
                self._stale.add(ident)

    def _load(self, name: str, ident: TableIdentifier) -> None:
        try:
            table = self.catalog.load_table(ident)
        except Exception:  # not created yet: named once the apply commits to it
            self._states.pop(name, None)
            return
        self._states[name] = _TableState(
            ident, current_snapshot_id(table), applied_lsn(table) or Lsn(0)
        )

    def _refresh_stale(self) -> None:
        with self._guard:
            stale, self._stale = self._stale, set()
            reload, self._reload = self._reload, False
        if reload:
            self.table = self.catalog.load_table(self.identifier)
        for ident in stale:
            self._load(self._source_name(ident), ident)

    # -- one batch's cut ----------------------------------------------------------------

    def stage(
        self,
        batch: Sequence[StagedSnapshot],
        *,
        lsn: Lsn,
        committed_at: dt.datetime | None,
        requested: bool = False,
    ) -> tuple[StagedSnapshot, Cut]:
        """The cut at ``lsn`` after ``batch`` (the batch's tables, staged), as rows
        appended to the cuts table, staged for the batch's catalog transaction."""
        self._refresh_stale()
        states = dict(self._states)
        for one in batch:
            ident = _ident(one.table)
            states[self._source_name(ident)] = _TableState(ident, one.snapshot_id, one.lsn)
        named = {n: s for n, s in states.items() if s.snapshot_id is not None and s.applied <= lsn}
        if committed_at is None:  # a requested cut: the last transaction before it
            latest = self.latest()
            committed_at = latest.committed_at if latest is not None else None
        cut = Cut(
            lsn=lsn,
            committed_at=committed_at,
            recorded_at=dt.datetime.now(dt.UTC),
            tables={n: s.snapshot_id for n, s in named.items() if s.snapshot_id is not None},
            iceberg={n: ".".join(s.iceberg) for n, s in named.items()},
            requested=requested,
        )
        path = self._write([cut])
        last = applied_lsn(self.table)
        staged = stage_files(
            self.table,
            added=[path],
            lsn=lsn if last is None or lsn > last else Lsn(int(last) + 1),
            base_snapshot_id=current_snapshot_id(self.table),
        )
        return staged, cut

    def committed(self, batch: Sequence[StagedSnapshot], cut: Cut) -> None:
        """The batch and its cut are committed: remember both."""
        for one in batch:
            ident = _ident(one.table)
            self._states[self._source_name(ident)] = _TableState(ident, one.snapshot_id, one.lsn)
        now = dt.datetime.now(dt.UTC)
        with self._guard:
            self._cuts = kept([*self._cuts, cut], now, self.retain_seconds)
        if _data_file_count(self.table) > MAX_FILES:
            self.prune()

    def applied_past(self, lsn: Lsn) -> list[str]:
        """Tables already holding a transaction above ``lsn``."""
        self._refresh_stale()
        return sorted(n for n, s in self._states.items() if s.applied > lsn)

    def latest(self) -> Cut | None:
        with self._guard:
            return self._cuts[-1] if self._cuts else None

    # -- retention ----------------------------------------------------------------------

    def protected(self, ident: TableIdentifier) -> set[int]:
        """The snapshots of ``ident`` that a kept cut names: expiry keeps them.
        Thread-safe (maintenance asks from its own thread)."""
        with self._guard:
            cuts = list(self._cuts)
        return _named(cuts, ident)

    def prune(self) -> None:
        """Rewrite the cuts table to the kept cuts (one data file)."""
        now = dt.datetime.now(dt.UTC)
        with self._guard:
            cuts = kept(self._cuts, now, self.retain_seconds)
            self._cuts = cuts
        path = self._write(cuts)
        last = applied_lsn(self.table) or Lsn(0)
        # Every file the table has is replaced (as a TRUNCATE): no listing to read.
        commit_files(self.table, added=[path], truncate=True, lsn=Lsn(int(last) + 1))
        logger.info("cuts table %s: %d cuts kept", table_name(self.table), len(cuts))

    def _write(self, cuts: Sequence[Cut]) -> str:
        where = data_directory(self.table)
        fs, directory = Storage.of(self.table.io.properties).filesystem(where)
        path = f"{directory}/cuts-{uuid.uuid4().hex}.parquet"
        pq.write_table(_rows(cuts, arrow_schema_of(self.table)), path, filesystem=fs)
        return location.join(data_directory(self.table), path.rsplit("/", 1)[1])


def _named(cuts: Iterable[Cut], ident: TableIdentifier) -> set[int]:
    name = ".".join(ident)
    return {
        c.tables[source]
        for c in cuts
        for source, iceberg in c.iceberg.items()
        if iceberg == name and source in c.tables
    }


def protected_snapshots(
    catalog: Catalog, identifier: TableIdentifier, retain_seconds: float
) -> Callable[[TableIdentifier], set[int]]:
    """For a process other than the run (``sparkapply maintain``): the snapshots the
    kept cuts in the cuts table name, by table."""
    if not catalog.table_exists(identifier):
        return lambda ident: set()
    cuts = kept_cuts(catalog.load_table(identifier), retain_seconds)
    return lambda ident: _named(cuts, ident)


def kept_cuts(table: Table, retain_seconds: float) -> list[Cut]:
    """The kept cuts of the cuts table ``table``. Every cut is read, not only those
    younger than ``retain_seconds``: the newest is kept however old it is (a mirror
    stopped for longer than that, or a publisher with nothing to send), and expiry
    took its snapshots when it was left out here."""
    return kept(read_cuts(table), dt.datetime.now(dt.UTC), retain_seconds)


def _data_file_count(table: Table) -> int:
    """From the snapshot summary: reading the manifests after every batch would cost
    more than the cut itself."""
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.additional_properties.get("total-data-files", 0))


def _ident(table: Table) -> TableIdentifier:
    namespace, name = table.name()[-2:]
    return namespace, name


def _rows(cuts: Sequence[Cut], schema: pa.Schema) -> pa.Table:
    rows = [
        {
            "lsn": int(c.lsn),
            "pg_lsn": str(c.lsn),
            "committed_at": c.committed_at,
            "recorded_at": c.recorded_at,
            "requested": c.requested,
            "source_table": source,
            "iceberg_table": c.iceberg.get(source, source),
            "snapshot_id": snapshot_id,
        }
        for c in cuts
        for source, snapshot_id in sorted(c.tables.items())
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def read_cuts(
    table: Table, *, since: dt.datetime | None = None, at_most: Lsn | None = None
) -> list[Cut]:
    """The cuts in the cuts table (recorded at or after ``since``; at or before LSN
    ``at_most``), in LSN order."""
    scan = table.scan(row_filter=f"lsn <= {int(at_most)}") if at_most is not None else table.scan()
    rows = scan.to_arrow()
    if since is not None:
        rows = rows.filter(
            pc.greater_equal(
                rows["recorded_at"], pa.scalar(since, rows.schema.field("recorded_at").type)
            )
        )
    return _cuts_of(rows.to_pylist())


def _cuts_of(rows: Iterable[Mapping[str, object]]) -> list[Cut]:
    by_lsn: dict[int, Cut] = {}
    for row in rows:
        lsn = int(row["lsn"])  # type: ignore[call-overload]
        cut = by_lsn.get(lsn)
        if cut is None:
            cut = by_lsn[lsn] = Cut(
                lsn=Lsn(lsn),
                committed_at=row["committed_at"],  # type: ignore[arg-type]
                recorded_at=row["recorded_at"],  # type: ignore[arg-type]
                tables={},
                requested=bool(row["requested"]),
            )
        source = str(row["source_table"])
        cut.tables[source] = int(row["snapshot_id"])  # type: ignore[call-overload]
        cut.iceberg[source] = str(row["iceberg_table"])
    return [by_lsn[k] for k in sorted(by_lsn)]


# -- named cuts: Iceberg tags ---------------------------------------------------------


def tag_cut(catalog: Catalog, cut: Cut, name: str, *, atomic: bool) -> list[str]:
    """Put the tag ``name`` on every table of ``cut`` at its snapshot: in one catalog
    transaction when ``atomic``, otherwise table by table. A tag is a head: expiry
    keeps its snapshot (and files) until :func:`untag`. Returns the tagged tables."""
    _check_tag_name(name)
    staged = []
    for source, snapshot_id in sorted(cut.tables.items()):
        table = catalog.load_table(cut.iceberg.get(source, source))
        if table.metadata.snapshot_by_id(snapshot_id) is None:
            raise CutError(
                f"snapshot {snapshot_id} of the cut at {cut.lsn} is expired",
                table=source,
                hint="tag a newer cut (cuts older than [maintenance] retain_seconds are thinned)",
            )
        if name in table.metadata.refs:
            raise CutError(
                f"table {source} already has a ref named {name!r}",
                table=source,
                hint=f"`sparkapply cut --untag {name}` first, or choose another name",
            )
        # pyiceberg's pydantic models take field names; mypy knows only their aliases.
        update = SetSnapshotRefUpdate(  # type: ignore[call-arg]
            ref_name=name,
            type=SnapshotRefType.TAG,
            snapshot_id=snapshot_id,
        )
        require = AssertRefSnapshotId(ref=name, snapshot_id=None)  # type: ignore[call-arg]
        staged.append(_ref_change(table, cut.lsn, snapshot_id, name, update, require))
    _commit_refs(catalog, staged, atomic=atomic)
    return [table_name(s.table) for s in staged]


def untag(catalog: Catalog, name: str, tables: Iterable[str], *, atomic: bool) -> list[str]:
    """Remove the tag ``name`` from ``tables`` (Iceberg names) that have it."""
    _check_tag_name(name)
    staged = []
    for iceberg in sorted(set(tables)):
        table = catalog.load_table(iceberg)
        ref = table.metadata.refs.get(name)
        if ref is None or ref.snapshot_ref_type != SnapshotRefType.TAG:
            continue
        update = RemoveSnapshotRefUpdate(ref_name=name)  # type: ignore[call-arg]
        require = AssertRefSnapshotId(ref=name, snapshot_id=ref.snapshot_id)  # type: ignore[call-arg]
        staged.append(
            _ref_change(table, Lsn(0), ref.snapshot_id, name, update, require, removes=True)
        )
    _commit_refs(catalog, staged, atomic=atomic)
    return [table_name(s.table) for s in staged]


def _check_tag_name(name: str) -> None:
    if not name or name == MAIN_BRANCH:
        raise CutError(
            f"{name!r} cannot be a tag name", hint="name the cut, e.g. month-end-2026-11"
        )


def _ref_change(
    table: Table,
    lsn: Lsn,
    snapshot_id: int,
    name: str,
    update: TableUpdate,
    require: TableRequirement,
    *,
    removes: bool = False,
) -> StagedSnapshot:
    delta = StagedChange(snapshot_id, (update,), (require,), [])
    return StagedSnapshot(table, lsn, delta, ref=name, removes_ref=removes)


def _commit_refs(catalog: Catalog, staged: Sequence[StagedSnapshot], *, atomic: bool) -> None:
    try:
        if atomic:
            commit_together(catalog, staged)
        else:
            for one in staged:
                commit_staged(one)
    except CommitConflictError as exc:
        raise CutError(
            f"a table changed its tags meanwhile: {exc.message}",
            hint="nothing was changed; run the command again",
        ) from exc
