"""The copy driver: which tables to copy, as of which snapshot, and the hand-over to the stream.

A user's tables already hold rows when sparkapply first starts. The copy reads every
published table as of one snapshot of the publisher, in Spark tasks (one per slice of
heap blocks, see :mod:`sparkapply.copy.tasks`), and commits each table's files in one
Iceberg snapshot; the stream then applies everything committed after that snapshot.

THE HAND-OVER (why no row is lost or applied twice)

    ``CREATE_REPLICATION_SLOT s LOGICAL pgoutput (SNAPSHOT 'export')`` returns the
    slot's consistent point C and the name of a snapshot S. PostgreSQL guarantees the
    pair fits: S sees exactly the transactions whose commit record lies before C, and
    the slot decodes exactly those whose commit record starts at or after C (the
    decoder skips a commit when ``commit < start_decoding_at``, and that is C for a
    new slot). A transaction still running, prepared included, when the slot began
    building its snapshot must end before the slot becomes consistent, so none
    straddles C; one prepared before C and committed after it is in neither S nor
    skipped: the stream sends it whole at COMMIT PREPARED.

    Every slice joins S (``SET TRANSACTION SNAPSHOT``), so the copy of every table is
    the table as of C. Each table is committed in ONE Iceberg snapshot stamped with
    the applied LSN **C - 1**: "contains every commit below C". The applier skips, per
    table, the transactions whose commit LSN is at or below the applied LSN, and
    applies the rest: exactly those at or after C. Stamping C itself would be wrong by
    one transaction: C is the end of the WAL record that made the slot consistent,
    which is where the next record starts, and a commit record can start right there;
    it is not in S and is decoded, and it must be applied.

    Streaming starts at the slot's confirmed position, which is C. The snapshot lives
    while the exporting replication connection stays idle; it is kept open during the
    copy and its next command is START_REPLICATION. The copy is a cut at C - 1, and is
    recorded as one with it (:mod:`sparkapply.copy.commit`).

FAILURE AND RESTART

    What is durable is the Iceberg table: a table whose copy committed has an applied
    LSN (the copy's snapshot is the first sparkapply snapshot of the table); a table
    without one has not been copied. Nothing is acknowledged to the publisher before
    every table has been copied: streaming (and with it every status update) starts
    after the copy. On restart the exported snapshot is gone with its connection:

    - the slot exists and NO published table has been copied (and no prepared
      transaction is staged): nothing was ever applied from this slot, so it is
      dropped and created again with a fresh exported snapshot, and everything is
      copied as above. Only when ``create_slot`` is on.
    - some tables were copied: those stay; the others are copied from a snapshot of
      their own. ``CREATE_REPLICATION_SLOT t TEMPORARY LOGICAL pgoutput (SNAPSHOT
      'export')`` on a second replication connection gives a snapshot S' and its
      consistent point C' with the same guarantee as above, and C' is at or after the
      main slot's confirmed position F (F was reported before C' existed). The table
      is stamped C' - 1; streaming resumes at F; the table's transactions between F
      and C' are in S' and are skipped by their commit LSN, those at or after C' are
      applied. The other tables are unaffected: they skip by their own applied LSN.

    A kill anywhere leaves each table either committed (complete, stamped) or not
    committed at all (data files written by the tasks are unreferenced orphans), and
    the rules above re-copy exactly the tables that are not. The commit of the copy
    replaces the table's contents, so a table that had files without an applied LSN
    (never the case for tables sparkapply made) cannot end up with rows twice.

TABLES ADDED LATER, AND RESYNC

    A table that joins the publication while the stream runs is found by a periodic
    check of ``pg_publication_tables`` or by its first RELATION message. It is copied
    the same way, from a temporary slot's snapshot S'/C', in the apply thread: before
    the batch that first touches it, or on its own when found by the check. The
    receiving thread keeps reading and answering keepalives meanwhile; no batch is
    applied while a copy runs (the apply pool has one thread), so no transaction of
    the table is acknowledged before its copy is durable. The table's transactions
    that the stream already holds or will send with a commit below C' are in S' and
    are skipped; the rest are applied. Changes made before the table was published are
    never in the stream; S' has them.

    ``sparkapply resync`` re-copies one table from a temporary slot's snapshot and
    replaces its contents in one Iceberg snapshot stamped C' - 1. The stored applied
    LSN is a commit the server had decoded before C' existed, so it is below C' - 1
    and the commit is allowed. It refuses to run while the main slot is in use: a
    running subscriber would keep applying from its cached applied LSN.

A TABLE DROPPED AND CREATED AGAIN

    PostgreSQL replicates neither DROP TABLE nor CREATE TABLE, and a table created
    again under the same name is a new relation (a new OID) that starts empty. Each
    copy records the OID it copied (table property :data:`SOURCE_OID_PROPERTY`, set
    after the copy's commit, so a crash between the two copies again rather than
    trusting an old OID). A published table, or a RELATION in the stream, whose OID
    is not the recorded one is copied again like a table added later: the copy
    replaces the old table's rows (and a column whose type changed is replaced, as
    by a resync), and the new table's transactions before the copy's point are
    skipped. A table copied before OIDs were recorded gets its OID recorded when
    first seen. A table renamed keeps its OID and is a new name: it is copied under
    it; the old name's Iceberg table stays, as a dropped table's does.

COLUMNS THAT ARRIVE WITH VALUES

    A RELATION that shows a new column says nothing of the rows already in the
    table, and PostgreSQL replicates no change for them: ``ADD COLUMN c int DEFAULT
    0`` (or an identity, a volatile default that rewrites the table, a stored
    generated column) gives every existing row a value on the publisher; a column
    added to the publication's column list, or renamed, brings the values it always
    had; a column dropped and added again under its name leaves the mirror with the
    old one's. The stream would leave them wrong. So every RELATION in a batch is
    compared with the publisher's catalog (:mod:`sparkapply.copy.columns`, which says
    when), and a table whose older rows may hold values the mirror lacks is copied
    again before the batch, like a table added later: its rows as of a fresh
    snapshot, its transactions before it skipped. A plain ``ADD COLUMN`` (null in the
    older rows on the publisher too) costs the query, and its column number is
    recorded. The intent is recorded on the table first (:data:`COPY_AGAIN_PROPERTY`,
    cleared by the copy's commit), so a kill before the copy commits (after which the
    column is no longer new) still copies it at the next start.

A COLUMN ICEBERG CANNOT RETYPE

    A column dropped and added again under its name with another type, or an ``ALTER
    COLUMN ... TYPE`` Iceberg cannot promote (text and int either way, timestamp and
    timestamptz, numeric to int, a decimal's scale), cannot be followed by a schema
    update: Iceberg only widens. PostgreSQL rewrote the rows, and sends none of them.
    So a RELATION with such a column has the table copied again before its batch, as
    above, and every copy replaces such a column in Iceberg by a new field of the same
    name and place (``sink/tables.py``, ``replace_columns``; a new field id) before it
    writes the rows: older snapshots keep the old field and its values.

A TABLE THAT LEAVES THE PUBLICATION

    Its changes are no longer sent, so if it is published again (or renamed back) its
    rows may differ from the mirror's. The periodic check that finds a table gone
    marks it :data:`COPY_AGAIN_PROPERTY`; published again, it is copied like a table
    added later (found by the check, or at the next start). A table removed and added
    back between two checks, or while sparkapply was stopped, is not seen to leave, as
    PostgreSQL's subscriber sees nothing without a REFRESH PUBLICATION in between:
    run ``resync`` for it.

Known limit: a partitioned table published through its root is copied in one slice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table

from sparkapply.changes.cut_requests import CutRequests
from sparkapply.changes.prepared import PreparedStore
from sparkapply.changes.transaction import CommittedTxn, relations_named
from sparkapply.config import Config
from sparkapply.convert.schema import (
    arrays_not_held_as_lists,
    iceberg_identifier,
    iceberg_schema_for,
    plan_evolution,
    source_identifier,
)
from sparkapply.convert.types import columns_as_text
from sparkapply.copy.columns import (
    LAST_ATTNUM_PROPERTY,
    CatalogColumn,
    catalog_columns,
    judge,
    numbers_property,
    recorded_last_attnum,
    recorded_numbers,
)
from sparkapply.copy.commit import CopiedTable, CopyCommit
from sparkapply.copy.job import PlannedTable, SliceJob
from sparkapply.copy.progress import CopyProgress
from sparkapply.copy.snapshot import (
    DEFAULT_SLICE_BYTES,
    SourceTable,
    begin_at_snapshot,
    describe_tables,
    multidimensional_columns,
    published_tables,
)
from sparkapply.copy.tasks import SliceResult
from sparkapply.errors import ConnectionLostError, CopyError, SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.lsn import Lsn
from sparkapply.pgoutput.messages import Relation, RelationColumn
from sparkapply.sink.atomic import atomic_commits
from sparkapply.sink.cuts import CutLog
from sparkapply.sink.files import current_snapshot_id, remove_orphans
from sparkapply.sink.progress import applied_lsn
from sparkapply.sink.relations import evolve_to
from sparkapply.sink.stats import live_rows
from sparkapply.sink.tables import ensure_table
from sparkapply.source.connection import ReplicationConnection, session_conninfo
from sparkapply.source.negotiation import quote_ident
from sparkapply.source.publisher import SlotInfo, ensure_slot, temporary_snapshot

log = logging.getLogger(__name__)

PUBLICATION_CHECK_INTERVAL = 30.0
"""Seconds between two looks at ``pg_publication_tables`` while streaming."""


@dataclass(frozen=True, slots=True)
class CopyPoint:
    """An exported snapshot and its slot's consistent point C."""

    snapshot: str
    lsn: Lsn

    @property
    def stamp(self) -> Lsn:
        """The applied LSN of a table copied at this point: every commit below C."""
        return Lsn(self.lsn - 1)


@dataclass(frozen=True, slots=True)
class _MirroredColumns:
    """What a table's rows were made from, as its properties record it."""

    numbers: dict[str, int] | None
    held: frozenset[str]
    last_attnum: int

    @classmethod
    def of(cls, table: Table) -> _MirroredColumns:
        return cls(
            recorded_numbers(table),
            frozenset(f.name for f in table.schema().fields),
            recorded_last_attnum(table),
        )


@dataclass(slots=True)
class CopyReport:
    point: CopyPoint | None = None
    rows: dict[str, int] = field(default_factory=dict)  # Iceberg "ns.table" → rows
    bytes: int = 0
    seconds: float = 0.0

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


class TableCopier:
    """Copies published tables into Iceberg; see the module doc for the contract.

    Call order: :meth:`before_streaming` once per replication session, on the
    connection that will stream, before START_REPLICATION; then, from the apply thread
    only, :meth:`before_batch` before each batch and :meth:`refresh` when :meth:`due`;
    :meth:`close` when the session ends (the connection kept for the catalog).
    :meth:`take_copied` returns the Iceberg tables copies committed since the last
    call: the caller tells whatever caches tables (the applier) to drop them.
    """

    def __init__(
        self,
        config: Config,
        spark: Any,
        catalog: Any,
        *,
        check_interval: float = PUBLICATION_CHECK_INTERVAL,
        slice_bytes: int = DEFAULT_SLICE_BYTES,
        cuts: CutLog | None = None,
    ) -> None:
        self.config = config
        self.catalog = catalog
        # The initial copy records the first cut with it; other copies ask the stream
        # for theirs (copy/commit.py), through the scheduler's requests when streaming.
        self.cuts = cuts
        self.cut_requests: CutRequests | None = None
        self.cuts_requested: list[Lsn] = []  # the cuts copies asked for, this run
        self._atomic = config.sink.atomic_commit and atomic_commits(catalog)
        self.check_interval = check_interval
        self._job = SliceJob(spark, config.source.dsn, slice_bytes)
        self._copied: list[tuple[str, str]] = []  # committed since take_copied()
        self.reports: list[CopyReport] = []
        # Copied (with the OID copied), or not ours to copy (None: any OID).
        self._known: dict[tuple[str, str], int | None] = {}
        # What a table's rows were made from (copy/columns.py), read once a session.
        self._columns: dict[tuple[str, str], _MirroredColumns] = {}
        # The columns of the last RELATION whose types the table holds (_retyped).
        self._typed: dict[tuple[str, str], tuple[RelationColumn, ...]] = {}
        self._last_check = time.monotonic()
        self._kept: psycopg.Connection[Any] | None = None  # see _catalog_now

    def target(self, schema: str, name: str) -> tuple[str, str]:
        """The Iceberg identifier of a PostgreSQL table (``[sink.tables]`` mapping)."""
        return iceberg_identifier(schema, name, self.config.sink.tables)

    def take_copied(self) -> list[tuple[str, str]]:
        """Iceberg tables a copy committed to since the last call (oldest first)."""
        out, self._copied = self._copied, []
        return out

    # -- session start -----------------------------------------------------------------

    def before_streaming(
        self, conn: ReplicationConnection, slot: SlotInfo, *, two_phase: bool
    ) -> SlotInfo:
        """Copy what is not yet copied; return the slot to stream from (maybe new)."""
        src = self.config.source
        if slot.created:
            self._copy_at(_point_of(slot), None, "initial copy")
            return slot
        with self._connect() as c:
            names = published_tables(c, src.publication)
        uncopied = self._uncopied(names)
        if not uncopied:
            return slot
        if len(uncopied) == len(names) and src.create_slot and not self._prepared_staged():
            log.warning(
                "slot %s exists but no published table has been copied (an earlier copy "
                "did not finish); dropping the slot and creating it with a fresh snapshot",
                slot.name,
            )
            conn.execute(f"DROP_REPLICATION_SLOT {quote_ident(slot.name)}")
            failpoint("copy-after-drop-slot")
            slot = ensure_slot(
                conn,
                slot.name,
                create=True,
                two_phase=two_phase,
                snapshot="export",
                failover=src.failover_for(conn.server_version),
            )
            log.info("created replication slot %s at %s", slot.name, slot.consistent_point)
            self._copy_at(_point_of(slot), None, "initial copy")
            return slot
        self.copy_from_temporary_snapshot(uncopied, "copy of the tables not yet copied")
        return slot

    # -- while streaming (apply thread) ------------------------------------------------

    def before_batch(self, batch: Sequence[CommittedTxn]) -> None:
        """Copy the tables a batch touches that have never been copied."""
        seen: set[tuple[str, str]] = set()
        for rel in relations_named(batch):
            key = source_identifier(rel)
            if key not in self._known or self._known[key] not in (None, rel.relation_id):
                seen.add(key)
        if seen:
            self._check(sorted(seen), "first change of the table in the stream")
        valued = self._columns_with_values(batch)
        if valued:
            self.copy_from_temporary_snapshot(
                valued, "copy again: columns with values the stream did not send"
            )

    def _columns_with_values(self, batch: Sequence[CommittedTxn]) -> list[tuple[str, str]]:
        """Tables a RELATION of ``batch`` shows columns of whose older rows may hold
        values the mirror lacks (module doc, COLUMNS THAT ARRIVE WITH VALUES); each is
        marked to be copied again. A new column with no such values has its number
        recorded."""
        newest: dict[tuple[str, str], tuple[Relation, Lsn]] = {}
        for txn in batch:
            for rel in txn.relation_messages:
                newest[source_identifier(rel)] = (rel, txn.commit_lsn)
        mine = [(k, rel, lsn) for k, (rel, lsn) in newest.items() if self._known.get(k) is not None]
        if not mine:
            return []
        out = []
        catalog = self._catalog_now([rel for _, rel, _ in mine])
        for (key, rel, lsn), now in zip(mine, catalog, strict=True):
            names = [col.name for col in rel.columns]
            mirrored = self._mirrored(key)
            verdict = judge(names, mirrored.numbers, mirrored.held, mirrored.last_attnum, now)
            retyped = self._retyped(key, rel, lsn)
            if retyped:
                out.append(key)
                continue
            if verdict.numbers == mirrored.numbers:
                continue
            table = self.catalog.load_table(self.target(*key))
            applied = applied_lsn(table)
            if applied is not None and lsn <= applied:
                continue  # a transaction the table holds: its schema is behind
            if verdict.copy_again and live_rows(table):
                log.warning(
                    "table %s.%s: column(s) %s arrive with values in rows the stream "
                    "does not resend (a default, a column newly published or renamed, "
                    "or dropped and added again); copying the table again",
                    *key,
                    ", ".join(verdict.copy_again),
                )
                mark_copy_again(
                    table, f"column(s) {', '.join(verdict.copy_again)} arrived with values"
                )
                out.append(key)
            else:
                _set_properties(table, numbers_property(verdict.numbers))
                self._columns[key] = dataclasses.replace(mirrored, numbers=verdict.numbers)
        return out

    def _retyped(self, key: tuple[str, str], rel: Relation, lsn: Lsn) -> list[str]:
        """The columns of ``rel`` whose type the table holds as one Iceberg cannot
        widen to the new (module doc, A COLUMN ICEBERG CANNOT RETYPE); if any, the
        table is marked to be copied again, which replaces them. A RELATION whose
        columns were found held before is not looked at again."""
        if self._typed.get(key) == rel.columns:
            return []
        table = self.catalog.load_table(self.target(*key))
        applied = applied_lsn(table)
        if applied is not None and lsn <= applied:
            return []  # a transaction the table holds: its schema is behind
        asked = arrays_not_held_as_lists(rel, table.schema())
        if asked:
            rel = columns_as_text(rel, self.multidimensional(rel.relation_id, asked))
        plan = plan_evolution(table.schema(), rel, replace_changed=True)
        if not plan.replace:
            self._typed[key] = rel.columns
            return []
        held = {f.name: f.field_type for f in table.schema().fields}
        changes = ", ".join(f"{c} {held[c]} to {t}" for c, t in plan.replace)
        log.warning(
            "table %s.%s: column(s) changed type in a way Iceberg cannot widen (%s); "
            "copying the table again, each such column replaced by a new one of the "
            "same name (older snapshots keep the old)",
            *key,
            changes,
        )
        mark_copy_again(table, f"column(s) changed type: {changes}")
        return [c for c, _ in plan.replace]

    def _catalog_now(self, relations: Sequence[Relation]) -> list[dict[str, CatalogColumn]]:
        """The catalog's columns now of each of ``relations``' columns, read on a
        connection kept from batch to batch (closed by :meth:`close`).

        A RELATION comes at a session's start and again after every invalidation of
        its table's cache entry on the publisher (an autovacuum, an ANALYZE, any DDL),
        and a connection of its own for each batch that brought one cost a backend's
        start on the publisher and 3 ms here on an idle machine, and in the race's
        pgbench drain (bench/README.md) most of its first batch's check. A kept
        connection that broke meanwhile (the server restarted, an idle session
        timeout) is replaced, and the read-only query asked once more."""
        for attempt in (1, 2):
            conn = self._kept
            if conn is None or conn.closed or conn.broken:
                conn = self._kept = self._connect()
            try:
                return [
                    catalog_columns(conn, rel.relation_id, [col.name for col in rel.columns])
                    for rel in relations
                ]
            except psycopg.OperationalError as exc:
                self.close()
                if attempt == 2:
                    raise ConnectionLostError(
                        f"lost the connection to the publisher reading its catalog: "
                        f"{str(exc).strip()}"
                    ) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection kept for the catalog (a session's end)."""
        conn, self._kept = self._kept, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _mirrored(self, key: tuple[str, str]) -> _MirroredColumns:
        known = self._columns.get(key)
        if known is None:
            table = self.catalog.load_table(self.target(*key))
            known = self._columns[key] = _MirroredColumns.of(table)
        return known

    def due(self) -> bool:
        return time.monotonic() - self._last_check >= self.check_interval

    def refresh(self) -> None:
        """The periodic check: copy tables added to the publication since the last one;
        mark those that left it, to be copied if they come back (module doc)."""
        self._last_check = time.monotonic()
        with self._connect() as c:
            names = published_tables(c, self.config.source.publication)
        published = set(names)
        for key in [k for k, oid in self._known.items() if oid is not None]:
            if key not in published:
                self._left(key)
        new = [n for n in names if self._known.get(n) is None]
        if new:
            self._check(new, "table added to the publication")

    def _left(self, key: tuple[str, str]) -> None:
        log.warning(
            "table %s.%s is no longer published (removed from the publication, renamed or "
            "dropped): its Iceberg table keeps the rows it has, and is copied again if it "
            "is published again",
            *key,
        )
        del self._known[key]
        with contextlib.suppress(NoSuchTableError):  # dropped from the catalog by hand
            mark_copy_again(self.catalog.load_table(self.target(*key)), "it left the publication")

    def _check(self, names: Sequence[tuple[str, str]], reason: str) -> None:
        with self._connect() as c:
            published = set(published_tables(c, self.config.source.publication))
        for name in names:
            if name not in published:
                log.warning(
                    "table %s.%s is in the stream but not in the publication now; its "
                    "changes are applied without a copy",
                    *name,
                )
                self._known[name] = None
        uncopied = self._uncopied([n for n in names if n in published])
        if uncopied:
            self.copy_from_temporary_snapshot(uncopied, reason)

    def _uncopied(self, names: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Create the Iceberg tables of ``names``; return those never copied."""
        if not names:
            return []
        with self._connect() as c:
            tables = describe_tables(c, self.config.source.publication, names)
        out = []
        for t in tables:
            # Created if missing, otherwise left as it is: the schema of a table that was
            # copied follows the stream's RELATION messages, not the catalog of now.
            ident = self.target(t.schema, t.name)
            table = ensure_table(self.catalog, ident, iceberg_schema_for(t.relation))
            copied_oid = source_oid(table)
            if applied_lsn(table) is None:
                out.append(t.key)
            elif COPY_AGAIN_PROPERTY in table.properties:
                log.warning(
                    "table %s is marked to be copied again (%s); copying it",
                    t.qualified,
                    table.properties[COPY_AGAIN_PROPERTY],
                )
                out.append(t.key)
            elif copied_oid is not None and copied_oid != t.oid:
                log.warning(
                    "table %s is a new relation (OID %d; %d was copied): it was dropped and "
                    "created again; copying it again, replacing the rows of the old one",
                    t.qualified,
                    t.oid,
                    copied_oid,
                )
                out.append(t.key)
            else:
                if copied_oid is None:  # copied before OIDs were recorded
                    record_copied(table, t)
                self._known[t.key] = t.oid
                self._columns[t.key] = _MirroredColumns.of(table)
        return out

    def multidimensional(self, relation_oid: int, names: Sequence[str]) -> set[str]:
        """The columns of ``names`` the publisher's catalog declares with more than one
        dimension: a list column the stream adds is mirrored as text if so declared."""
        with self._connect() as c:
            return multidimensional_columns(c, relation_oid, names)

    # -- copying -------------------------------------------------------------------------

    def copy_from_temporary_snapshot(
        self, names: Sequence[tuple[str, str]], reason: str
    ) -> CopyReport:
        """Copy ``names`` as of a fresh snapshot of a temporary slot (see the module doc)."""
        with self.temporary_snapshot(", ".join(f"{s}.{t}" for s, t in names)) as point:
            return self._copy_at(point, names, reason)

    @contextlib.contextmanager
    def temporary_snapshot(self, what: str) -> Iterator[CopyPoint]:
        """A snapshot exported by a temporary slot, alive for the block."""
        with temporary_snapshot(self.config.source, "copy", f"the copy of {what}") as (
            snapshot,
            point,
        ):
            yield CopyPoint(snapshot, point)

    def _copy_at(
        self, point: CopyPoint, only: Sequence[tuple[str, str]] | None, reason: str
    ) -> CopyReport:
        """Copy the published tables (or ``only`` of them) as of ``point``."""
        started = time.monotonic()
        src = self.config.source
        report = CopyReport(point)
        with self._connect() as c:
            begin_at_snapshot(c, point.snapshot)
            tables = describe_tables(c, src.publication, only)
            c.execute("COMMIT")
        if not tables:
            return report
        log.info(
            "%s: %d table(s) as of %s (snapshot %s): %s",
            reason,
            len(tables),
            point.lsn,
            point.snapshot,
            ", ".join(t.qualified for t in tables),
        )
        # Every table exists in Iceberg before any row is read (empty ones included).
        planned = [self._plan(t, point) for t in tables]
        token = secrets.token_hex(4)
        tag_prefix = f"sparkapply-copy {token}:"
        tasks = self._job.tasks(planned, point.snapshot, tag_prefix)
        slices_of = {t.tag: t.table for t in tasks}
        estimates = {p.source.qualified: p.source.estimated_rows for p in planned}
        results: list[SliceResult] = []
        if tasks:
            with CopyProgress(src.dsn, tag_prefix, slices_of, estimates) as progress:
                results = self._job.run(tasks)
                for p in planned:
                    mine = [r for r in results if r.table == p.source.qualified]
                    if mine and all(r.error is None for r in mine):
                        progress.table_done(
                            p.source.qualified,
                            sum(r.rows for r in mine),
                            sum(r.bytes for r in mine),
                            time.monotonic() - started,
                        )
        failpoint("copy-before-commit")
        errors = self._commit(planned, results, point, report, with_cut=only is None)
        if only is not None and report.rows:
            self._request_cut(point)
        report.seconds = time.monotonic() - started
        self.reports.append(report)
        if errors:
            raise errors[0]
        log.info(
            "%s done: %s rows in %d table(s) in %.1f s; stamped %s",
            reason,
            f"{report.total_rows:,}",
            len(planned),
            report.seconds,
            point.stamp,
        )
        return report

    def _plan(self, source: SourceTable, point: CopyPoint) -> PlannedTable:
        ident = self.target(source.schema, source.name)
        table = self._prepare(source, point.lsn)
        applied = applied_lsn(table)
        if applied is not None and applied >= point.stamp:
            raise CopyError(
                f"the Iceberg table {'.'.join(ident)} already contains changes up to "
                f"{applied}, not before the copy's snapshot at {point.lsn}",
                table=source.qualified,
                hint="another sparkapply is applying to this table; stop it, then run "
                "`sparkapply resync` for the table",
            )
        return PlannedTable(source, ident, table, current_snapshot_id(table))

    def _prepare(self, source: SourceTable, lsn: Lsn | None) -> Any:
        """Create the Iceberg table, or evolve it to the source's columns, as the
        applier does for a RELATION message; a column Iceberg cannot retype is
        replaced (module doc, A COLUMN ICEBERG CANNOT RETYPE): the copy writes every
        row again."""
        ident = self.target(source.schema, source.name)
        table = ensure_table(self.catalog, ident, iceberg_schema_for(source.relation))
        replaced = plan_evolution(table.schema(), source.relation, replace_changed=True).replace
        if (
            replaced
            and applied_lsn(table) is not None
            and COPY_AGAIN_PROPERTY not in table.properties
        ):
            # Killed before the copy commits, the table would hold the new column, null
            # in rows the stream never sends again (a resync's): the next start copies.
            mark_copy_again(table, f"column(s) {', '.join(c for c, _ in replaced)} replaced")
        return evolve_to(self.catalog, ident, table, source.relation, lsn=lsn, replace_changed=True)

    def _commit(
        self,
        planned: list[PlannedTable],
        results: list[SliceResult],
        point: CopyPoint,
        report: CopyReport,
        *,
        with_cut: bool,
    ) -> list[SparkapplyError]:
        """One Iceberg snapshot per table that copied without error (``commit.py``:
        with the cut at the copy's point when ``with_cut``); orphans removed for the
        others. Returns the errors (each names its table)."""
        errors: list[SparkapplyError] = []
        copied: list[CopiedTable] = []
        for p in planned:
            mine = [r for r in results if r.table == p.source.qualified]
            files = [f for r in mine for f in r.files]
            failed = [r.error for r in mine if r.error is not None]
            if failed:
                remove_orphans(p.table, files)
                errors.extend(failed)
                continue
            copied.append(CopiedTable(p, files, sum(r.rows for r in mine)))
        # Atomic only with the cut: the one transaction checks each table's exact
        # metadata, which maintenance beside the apply may have moved (an expiry) while
        # a later copy ran; a table's own commit checks only its snapshot.
        atomic = self._atomic and with_cut
        cuts = self.cuts if with_cut else None
        done, failed_commits = CopyCommit(self.catalog, point.lsn, atomic, cuts).commit(copied)
        errors.extend(failed_commits)
        for one in done:
            p = one.planned
            record_copied(p.table, p.source)
            self._columns.pop(p.source.key, None)
            report.rows[".".join(p.ident)] = one.rows
            report.bytes += sum(r.bytes for r in results if r.table == p.source.qualified)
            self._known[p.source.key] = p.source.oid
            self._copied.append(p.ident)
        return errors

    def _request_cut(self, point: CopyPoint) -> None:
        """A copy from a temporary slot: its cut is asked of the stream (``commit.py``,
        THE CUT A COPY MAKES)."""
        if not self.config.sink.cuts_table:
            return
        requests = self.cut_requests or CutRequests(self.config.work_dir)
        requests.add(point.stamp)
        self.cuts_requested.append(point.stamp)
        log.info("a cut at %s, the copy's point, is recorded once the stream is there", point.stamp)

    # -- helpers -------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        dsn = self.config.source.dsn
        try:
            conninfo = session_conninfo(dsn, application_name="sparkapply-copy-driver")
            return psycopg.connect(conninfo, autocommit=True)
        except psycopg.OperationalError as exc:
            raise ConnectionLostError(
                f"cannot connect to the publisher for the copy: {str(exc).strip()}"
            ) from exc

    def _prepared_staged(self) -> bool:
        return bool(PreparedStore.in_work_dir(self.config.work_dir).xids())


SOURCE_OID_PROPERTY = "sparkapply.source-oid"
"""Table property: the OID of the PostgreSQL relation the table was copied from."""
COPY_AGAIN_PROPERTY = "sparkapply.copy-again"
"""Table property, while set: the table is to be copied again (the value says why)."""


def source_oid(table: Table) -> int | None:
    text = table.properties.get(SOURCE_OID_PROPERTY)
    return int(text) if text is not None and text.isdigit() else None


def record_copied(table: Table, source: SourceTable) -> None:
    """Record what ``table`` was copied from, and that it needs no copy again."""
    _set_properties(
        table,
        {
            SOURCE_OID_PROPERTY: str(source.oid),
            LAST_ATTNUM_PROPERTY: str(source.last_attnum),
            **numbers_property(dict(source.column_numbers)),
        },
        remove=(COPY_AGAIN_PROPERTY,),
    )


def mark_copy_again(table: Table, why: str) -> None:
    _set_properties(table, {COPY_AGAIN_PROPERTY: why})


def _set_properties(table: Table, properties: dict[str, str], remove: Sequence[str] = ()) -> None:
    """A commit that loses to maintenance's is tried once more on the table as it then
    is. Not recorded, the next start copies the table again (as after a crash here),
    which is slow but right."""
    for attempt in (1, 2):
        try:
            present = [k for k in remove if k in table.properties]  # pyiceberg: else KeyError
            with table.transaction() as txn:
                txn.set_properties(properties)
                if present:
                    txn.remove_properties(*present)
            return
        except CommitFailedException:
            if attempt == 2:
                log.warning(
                    "table %s: could not record %s", ".".join(table.name()), sorted(properties)
                )
                return
            table.refresh()


def _point_of(slot: SlotInfo) -> CopyPoint:
    if not slot.snapshot_name or slot.consistent_point is None:
        raise CopyError(
            f"replication slot {slot.name} was created without an exported snapshot",
            hint="the publisher must accept CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')",
        )
    return CopyPoint(slot.snapshot_name, slot.consistent_point)
