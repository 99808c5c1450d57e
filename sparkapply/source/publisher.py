"""Preflight against the publisher: version, wal_level, publications, replica identity, slot.

Each check fails with an operator error that names what is wrong and how to fix it,
before anything is streamed or acknowledged.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import psycopg

from sparkapply.config import SourceConfig
from sparkapply.errors import (
    SlotBusyError,
    SlotError,
    SourceError,
)
from sparkapply.lsn import Lsn
from sparkapply.source.connection import ReplicationConnection, connect, describe_dsn
from sparkapply.source.negotiation import (
    Protocol,
    alter_slot_failover_command,
    create_slot_command,
    negotiate,
    quote_ident,
    quote_literal,
)
from sparkapply.source.preflight import publications as preflight_publications
from sparkapply.source.preflight import replication_role, wal_level

SLOT_RELEASE_WAIT = 30.0  # seconds to wait for a slot held by a vanished consumer

log = logging.getLogger(__name__)

Identity = Literal["key", "full", "none"]

# A table's replica identity read the way PostgreSQL's RelationGetReplicaIndex does:
# DEFAULT is the primary key, USING INDEX the flagged index, each only if that index
# is valid and immediate (a DEFERRABLE primary key is no identity); otherwise none.
_PUBLISHED_TABLES = """
    SELECT DISTINCT pt.schemaname, pt.tablename, pt.attnames, pt.rowfilter,
           c.relreplident,
           EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
                   AND i.indisvalid AND i.indimmediate
                   AND ((c.relreplident = 'd' AND i.indisprimary)
                        OR (c.relreplident = 'i' AND i.indisreplident)))
    FROM pg_publication_tables pt
    JOIN pg_namespace n ON n.nspname = pt.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
    WHERE pt.pubname = ANY(%s)
    ORDER BY 1, 2
"""


# A table dropped while pg_publication_tables is read fails the query (see
# publication_rows); asked again, it is gone. More drops than this in a row, each
# under the query, are not a race but a fault.
DROPPED_MEANWHILE_TRIES = 5


def publication_rows(
    conn: psycopg.Connection[Any], query: str, params: Sequence[Any]
) -> list[tuple[Any, ...]]:
    """The rows of a query on ``pg_publication_tables``, which lists the published
    tables and then opens each (PostgreSQL 16 on, to name its columns): a table dropped
    in between fails the query with XX000 "could not open relation with OID". That
    table is no longer published, so the query is asked again, in a savepoint when the
    connection is inside a transaction (the copy's snapshot)."""
    for _ in range(DROPPED_MEANWHILE_TRIES - 1):
        try:
            with conn.transaction():
                return conn.execute(query, params).fetchall()
        except psycopg.errors.InternalError_ as exc:
            if "could not open relation" not in str(exc):
                raise
            log.info("a published table was dropped while the publication was read; again")
    with conn.transaction():
        return conn.execute(query, params).fetchall()


def _identity(replident: str, has_index: bool) -> Identity:
    if replident == "f":
        return "full"
    if replident in ("d", "i") and has_index:
        return "key"
    return "none"


@dataclass(frozen=True, slots=True)
class PublishedTable:
    schema: str
    name: str
    columns: tuple[str, ...]
    row_filter: str | None
    identity: Identity = "key"

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class SlotInfo:
    name: str
    confirmed_flush: Lsn
    two_phase: bool
    created: bool
    consistent_point: Lsn | None = None
    snapshot_name: str | None = None
    failover: bool = False


def check_publisher(dsn: str, publications: Sequence[str]) -> tuple[Protocol, list[PublishedTable]]:
    """Version, REPLICATION, wal_level, publications (as ``check`` asks them:
    :mod:`sparkapply.source.preflight`, stopping at the first that fails) and the
    published tables with their replica identity (a table without one is mirrored
    append-only)."""
    where = describe_dsn(dsn)
    with connect(dsn) as conn:
        protocol = negotiate(conn.info.server_version)
        replication_role(conn, where).raise_if_failed()
        wal_level(conn, where).raise_if_failed()
        preflight_publications(conn, publications, where)[1].raise_if_failed()
        rows = publication_rows(conn, _PUBLISHED_TABLES, (list(publications),))
    tables = []
    for schema, name, attnames, rowfilter, replident, has_index in rows:
        identity = _identity(replident, has_index)
        if identity == "none":
            # The publisher itself refuses UPDATE and DELETE on such a table while a
            # publication publishes them, so only inserts (and TRUNCATE) ever arrive.
            log.info(
                "published table %s.%s has no replica identity: mirrored append-only "
                "(inserts, TRUNCATE, schema changes)",
                schema,
                name,
            )
        tables.append(PublishedTable(schema, name, tuple(attnames or ()), rowfilter, identity))
    return protocol, tables


def publisher_identity(conn: ReplicationConnection) -> str:
    """``system <id>, database <name>``: which publisher a mirror is of (IDENTIFY_SYSTEM;
    a physical standby shares its primary's system identifier)."""
    (system,) = conn.execute("IDENTIFY_SYSTEM")
    return f"system {system['systemid']}, database {system['dbname']}"


def _invalidated(slot: str, confirmed: str | None) -> SlotError:
    return SlotError(
        f"replication slot {slot!r} was invalidated by the publisher: the changes after "
        f"{confirmed or 'its confirmed position'} it held for the mirror are gone (it held "
        "back more WAL than max_slot_wal_keep_size allows, or, on a standby, it conflicted "
        "with recovery)",
        hint=f"drop it (SELECT pg_drop_replication_slot({quote_literal(slot)})) and run "
        "again: sparkapply creates it and copies every published table again, replacing "
        "the mirror's rows; raise max_slot_wal_keep_size (-1: no limit) so it does not "
        "happen again",
    )


def ensure_slot(
    conn: ReplicationConnection,
    slot: str,
    *,
    create: bool,
    two_phase: bool,
    snapshot: str = "nothing",
    failover: bool = False,
    reconnecting: bool = False,
) -> SlotInfo:
    """Find the slot (pgoutput, this database, not in use) or create it (a failover
    slot with ``failover``). ``reconnecting``: the slot may still be held by our own
    walsender of the session that just died, which is a transient error."""
    # A slot on a standby is invalidated by a conflict (PostgreSQL 16+) with its WAL.
    conflicting = "conflicting" if conn.server_version >= 160000 else "NULL"
    synced = "failover" if conn.server_version >= 170000 else "false"
    query = (
        "SELECT plugin, slot_type, database, active_pid, confirmed_flush_lsn, two_phase, "
        f"wal_status, {conflicting} AS conflicting, {synced} AS failover "
        f"FROM pg_replication_slots WHERE slot_name = {quote_literal(slot)}"
    )
    rows = conn.execute(query)
    # After a crash the server may not yet have noticed that our previous walsender's
    # client is gone; it lets go of the slot within moments.
    deadline = time.monotonic() + SLOT_RELEASE_WAIT
    while rows and rows[0]["active_pid"] and time.monotonic() < deadline:
        time.sleep(0.25)
        rows = conn.execute(query)
    if rows:
        row = rows[0]
        db = conn.execute("SELECT current_database() AS db")[0]["db"]
        if row["slot_type"] != "logical" or row["plugin"] != "pgoutput":
            raise SlotError(
                f"replication slot {slot!r} exists but is a {row['slot_type']} slot"
                + (f" of plugin {row['plugin']!r}" if row["plugin"] else "")
                + "; sparkapply needs a logical pgoutput slot",
                hint="choose another [source] slot name or drop that slot",
            )
        if row["database"] != db:
            raise SlotError(
                f"replication slot {slot!r} belongs to database {row['database']!r}, not {db!r}",
                hint="point [source] dsn at the slot's database or choose another slot",
            )
        if row["wal_status"] == "lost" or row["conflicting"] == "t":
            raise _invalidated(slot, row["confirmed_flush_lsn"])
        if row["active_pid"]:
            busy = SlotBusyError if reconnecting else SlotError
            raise busy(
                f"replication slot {slot!r} is in use by process {row['active_pid']} "
                f"(still after {SLOT_RELEASE_WAIT:.0f} s)",
                hint="the walsender of a connection that died holds it until the server's "
                "wal_sender_timeout"
                if reconnecting
                else "stop the other consumer of this slot (another sparkapply?)",
            )
        return SlotInfo(
            name=slot,
            confirmed_flush=Lsn(row["confirmed_flush_lsn"] or "0/0"),
            two_phase=row["two_phase"] == "t",
            created=False,
            failover=row["failover"] == "t",
        )
    if not create:
        raise SlotError(
            f"replication slot {slot!r} does not exist",
            hint="set [source] create_slot = true, or create it with "
            "pg_create_logical_replication_slot(name, 'pgoutput', false, true)",
        )
    res = conn.execute(
        create_slot_command(slot, two_phase=two_phase, snapshot=snapshot, failover=failover)
    )
    point = Lsn(res[0]["consistent_point"] or "0/0")
    return SlotInfo(
        name=slot,
        confirmed_flush=point,
        two_phase=two_phase,
        created=True,
        consistent_point=point,
        snapshot_name=res[0].get("snapshot_name"),
        failover=failover,
    )


def slot_exists(conn: ReplicationConnection, slot: str) -> bool:
    query = f"SELECT 1 AS one FROM pg_replication_slots WHERE slot_name = {quote_literal(slot)}"
    return bool(conn.execute(query))


def enable_failover(conn: ReplicationConnection, slot: SlotInfo) -> SlotInfo:
    """Make an existing slot a failover slot (PostgreSQL 17+; it must not be in use,
    which :func:`ensure_slot` saw to). A server that refuses leaves it as it was, with
    a warning: the mirror works, but a promoted standby will not have the slot."""
    try:
        conn.execute(alter_slot_failover_command(slot.name))
    except SourceError as exc:
        log.warning(
            "replication slot %s is not a failover slot and could not be made one (%s): "
            "after a failover to a standby it will be missing, and every table copied again",
            slot.name,
            exc.message,
        )
        return slot
    log.info("replication slot %s is now a failover slot (synced to standbys)", slot.name)
    return replace(slot, failover=True)


_temporary_slots = itertools.count()


@contextlib.contextmanager
def temporary_snapshot(
    source: SourceConfig,
    purpose: str,
    what: str,
    *,
    before: Callable[[Lsn], None] | None = None,
) -> Iterator[tuple[str, Lsn]]:
    """A snapshot exported by a temporary logical slot, alive for the block, and the
    slot's consistent point: the snapshot sees exactly the transactions committed
    before it. The server drops the slot with its connection when the block ends, also
    if the process is killed. ``purpose`` names the slot (``<slot>_<purpose>_<pid>_N``);
    ``what`` says in the log what it is for. ``before`` is called with the server's
    WAL position just before the slot is created (the consistent point is above it)."""
    base = re.sub(r"[^a-z0-9_]", "_", source.slot.lower())[:36]
    name = f"{base}_{purpose}_{os.getpid()}_{next(_temporary_slots)}"
    conn = ReplicationConnection(source.dsn, connect_timeout=source.connect_timeout)
    try:
        if before is not None:
            (system,) = conn.execute("IDENTIFY_SYSTEM")
            before(Lsn.parse(system["xlogpos"] or "0/0"))
        log.info(
            "creating temporary slot %s for %s (waits for the publisher's running "
            "transactions, prepared ones included, to end)",
            name,
            what,
        )
        rows = conn.execute(
            f"CREATE_REPLICATION_SLOT {quote_ident(name)} TEMPORARY LOGICAL pgoutput "
            "(SNAPSHOT 'export')"
        )
        snapshot = rows[0].get("snapshot_name") if rows else None
        if not snapshot:
            raise SourceError(
                f"temporary slot {name} exported no snapshot",
                hint="the publisher must support CREATE_REPLICATION_SLOT ... "
                "(SNAPSHOT 'export') (PostgreSQL 15+)",
            )
        yield snapshot, Lsn.parse(rows[0]["consistent_point"] or "0/0")
    finally:
        conn.close()
