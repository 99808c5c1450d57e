"""What ``sparkapply check`` asks the publisher, each answer a :class:`Finding`.

``run`` stops at the first thing wrong (:func:`sparkapply.source.publisher.check_publisher`);
``check`` asks everything, so that one pass shows an operator every fix at once. The
two agree on what is wrong because they ask the same questions: the version
(:func:`negotiate`), ``wal_level``, the REPLICATION attribute and the publications
come from the same queries and the same messages. What only ``check`` asks is what
``run`` finds out late or never: SELECT on each published table (the copy's first
failure), a table without a replica identity in a publication that publishes updates
or deletes (the publisher refuses the application's own UPDATE on it), room for the
slots and walsenders that ``run``, ``verify`` and late copies open, the slot itself,
and ``max_prepared_transactions``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg

from sparkapply.config import SourceConfig
from sparkapply.errors import PrivilegeError, PublicationError, SourceError, SparkapplyError
from sparkapply.source.connection import connect, describe_dsn
from sparkapply.source.negotiation import negotiate, quote_ident

Outcome = Literal["pass", "fail", "note"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of ``check``: what was checked, the outcome, what was seen, the fix;
    and the error ``run`` stops with when it fails there."""

    name: str
    outcome: Outcome
    detail: str
    fix: str | None = None
    error: type[SparkapplyError] = field(default=SourceError, repr=False, compare=False)

    @property
    def failed(self) -> bool:
        return self.outcome == "fail"

    def raise_if_failed(self) -> None:
        if self.failed:
            raise self.error(self.detail, hint=self.fix)

    def as_dict(self) -> dict[str, str | None]:
        return {"name": self.name, "outcome": self.outcome, "detail": self.detail, "fix": self.fix}


def _pass(name: str, detail: str) -> Finding:
    return Finding(name, "pass", detail)


def _fail(
    name: str, detail: str, fix: str | None, error: type[SparkapplyError] = SourceError
) -> Finding:
    return Finding(name, "fail", detail, fix, error)


def from_error(name: str, exc: SparkapplyError) -> Finding:
    """A failed check from the error ``run`` would stop with: its message and hint."""
    return _fail(name, exc.message, exc.hint)


Conn = psycopg.Connection[tuple[Any, ...]]


def publisher_findings(source: SourceConfig) -> list[Finding]:
    """Every check of the publisher, in the order an operator would fix them."""
    try:
        conn = connect(source.dsn, connect_timeout=source.connect_timeout)
    except SparkapplyError as exc:
        return [from_error("publisher", exc)]
    with conn:
        version = conn.info.server_version
        found = [_pass("publisher", f"{describe_dsn(source.dsn)}, server version {version}")]
        try:
            negotiate(version)
        except SparkapplyError as exc:
            return [*found, from_error("server version", exc)]
        where = describe_dsn(source.dsn)
        found += [wal_level(conn, where), replication_role(conn, where)]
        pubs, pub_finding = publications(conn, source.publication, where)
        found.append(pub_finding)
        if pubs:
            found += _published_tables(conn, pubs)
        found += [_slot(conn, source), _capacity(conn, source.slot), _prepared(conn)]
    return found


def wal_level(conn: Conn, where: str) -> Finding:
    row = conn.execute("SHOW wal_level").fetchone()
    level = str(row[0]) if row else "?"
    if level == "logical":
        return _pass("wal_level", "logical")
    return _fail(
        "wal_level",
        f"the publisher {where} has wal_level={level}, logical replication needs wal_level=logical",
        "ALTER SYSTEM SET wal_level = logical; then restart the server",
    )


def replication_role(conn: Conn, where: str) -> Finding:
    """The login needs REPLICATION (or superuser) to open a walsender; without it the
    replication connection is refused at every attempt, which no retry fixes."""
    row = conn.execute(
        "SELECT current_user, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    user, replication, superuser = (str(row[0]), bool(row[1]), bool(row[2])) if row else ("?", 0, 0)
    if replication or superuser:
        attribute = "REPLICATION" if replication else "SUPERUSER"
        return _pass("replication role", f"{user} has {attribute}")
    return _fail(
        "replication role",
        f"the login {user!r} on {where} lacks the REPLICATION attribute, so it cannot "
        "stream from a replication slot",
        f"as a superuser on the publisher: ALTER ROLE {quote_ident(user)} WITH REPLICATION; "
        "(and GRANT SELECT on the published tables, for the initial copy)",
        PrivilegeError,
    )


def publications(conn: Conn, names: Sequence[str], where: str) -> tuple[list[str], Finding]:
    rows = conn.execute(
        "SELECT pubname FROM pg_publication WHERE pubname = ANY(%s)", (list(names),)
    ).fetchall()
    present = [str(r[0]) for r in rows]
    missing = [n for n in names if n not in present]
    if missing:
        return present, _fail(
            "publication",
            f"publication {', '.join(repr(m) for m in missing)} does not exist on {where}",
            "CREATE PUBLICATION <name> FOR TABLE ... (or FOR ALL TABLES) on the publisher, "
            "or fix [source] publication",
            PublicationError,
        )
    return present, _pass("publication", ", ".join(present))


# Each published table, whether this login may read it (the copy's COPY), and whether
# a publication that holds it publishes updates or deletes while it has no replica
# identity (read as source/publisher.py reads it).
_TABLES = """
    SELECT pt.schemaname, pt.tablename,
           has_table_privilege(c.oid, 'SELECT'),
           c.relreplident = 'f' OR EXISTS (
               SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
               AND i.indisvalid AND i.indimmediate
               AND ((c.relreplident = 'd' AND i.indisprimary)
                    OR (c.relreplident = 'i' AND i.indisreplident))),
           bool_or(p.pubupdate OR p.pubdelete)
    FROM pg_publication_tables pt
    JOIN pg_publication p ON p.pubname = pt.pubname
    JOIN pg_namespace n ON n.nspname = pt.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
    WHERE pt.pubname = ANY(%s)
    GROUP BY 1, 2, 3, 4 ORDER BY 1, 2
"""


def _published_tables(conn: Conn, pubs: list[str]) -> list[Finding]:
    rows = conn.execute(_TABLES, (pubs,)).fetchall()
    if not rows:
        return [Finding("published tables", "note", "none yet: the mirror starts empty")]
    names = [f"{r[0]}.{r[1]}" for r in rows]
    unreadable = [n for n, r in zip(names, rows, strict=True) if not r[2]]
    keyless = [n for n, r in zip(names, rows, strict=True) if not r[3] and r[4]]
    found = [_pass("published tables", f"{len(rows)}: {_some(names)}")]
    if unreadable:
        found.append(
            _fail(
                "select privilege",
                f"the login cannot SELECT {_some(unreadable)}, which the initial copy reads",
                "GRANT SELECT ON <table> TO <login>; (or GRANT pg_read_all_data)",
            )
        )
    else:
        found.append(_pass("select privilege", "every published table"))
    if keyless:
        found.append(
            _fail(
                "replica identity",
                f"{_some(keyless)} has no replica identity in a publication that publishes "
                "updates or deletes: the publisher refuses UPDATE and DELETE on it",
                "add a primary key, or ALTER TABLE <table> REPLICA IDENTITY FULL (or USING "
                "INDEX); or publish it with publish = 'insert, truncate'",
            )
        )
    else:
        found.append(_pass("replica identity", "every table that publishes updates has one"))
    return found


def _some(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _slot(conn: Conn, source: SourceConfig) -> Finding:
    failover = "failover" if conn.info.server_version >= 170000 else "NULL"
    row = conn.execute(
        "SELECT plugin, slot_type, database = current_database(), active_pid, "
        f"confirmed_flush_lsn::text, wal_status, {failover} "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (source.slot,),
    ).fetchone()
    name = f"slot {source.slot}"
    if row is None:
        if source.create_slot:
            return _pass(name, "absent: the first run creates it, then copies every table")
        return _fail(
            name,
            f"replication slot {source.slot!r} does not exist and create_slot is false",
            "set [source] create_slot = true, or create it with "
            "pg_create_logical_replication_slot(name, 'pgoutput', false, true)",
        )
    plugin, kind, same_db, pid, confirmed, wal_status, synced = row
    if kind != "logical" or plugin != "pgoutput" or not same_db:
        return _fail(
            name,
            f"{source.slot!r} is a {kind} slot of plugin {plugin!r}"
            + ("" if same_db else " in another database"),
            "choose another [source] slot name, or drop that slot",
        )
    if wal_status == "lost":
        return _fail(
            name,
            f"{source.slot!r} was invalidated: the changes after {confirmed} are gone",
            f"drop it (SELECT pg_drop_replication_slot('{source.slot}')) and run again: "
            "every table is copied again",
        )
    user = f"; in use by process {pid}" if pid else ""
    kept = {True: "; a failover slot", False: "; not a failover slot", None: ""}[synced]
    return _pass(name, f"exists, confirmed {confirmed}{kept}{user}")


def _capacity(conn: Conn, slot: str) -> Finding:
    """Room for the slot (when it is still to be made) and its walsender, plus one
    temporary slot and walsender, which ``verify`` and late copies open."""
    row = conn.execute(
        "SELECT current_setting('max_replication_slots')::int, "
        "(SELECT count(*) FROM pg_replication_slots), "
        "current_setting('max_wal_senders')::int, "
        "(SELECT count(*) FROM pg_stat_replication), "
        "(SELECT active FROM pg_replication_slots WHERE slot_name = %s)",
        (slot,),
    ).fetchone()
    assert row is not None
    max_slots, slots, max_senders, senders, active = row
    need_slots = 1 + (0 if active is not None else 1)
    need_senders = 1 + (0 if active else 1)
    free_slots, free_senders = max_slots - slots, max_senders - senders
    detail = (
        f"{free_slots} of {max_slots} replication slots free (needs {need_slots}), "
        f"{free_senders} of {max_senders} walsenders free (needs {need_senders})"
    )
    if free_slots >= need_slots and free_senders >= need_senders:
        return _pass("capacity", detail)
    return _fail(
        "capacity",
        detail + "; verify and tables added to the publication later take a temporary slot",
        "raise max_replication_slots / max_wal_senders (ALTER SYSTEM SET ...; restart), or "
        "drop slots nothing uses (SELECT slot_name, active FROM pg_replication_slots)",
    )


def _prepared(conn: Conn) -> Finding:
    row = conn.execute("SHOW max_prepared_transactions").fetchone()
    count = int(row[0]) if row else 0
    if count:
        return Finding(
            "prepared transactions", "note", f"max_prepared_transactions = {count}: mirrored"
        )
    return Finding(
        "prepared transactions",
        "note",
        "max_prepared_transactions = 0: the publisher runs no PREPARE TRANSACTION",
    )
