"""What to ask the publisher for, by server version, and the commands that ask it.

Pure: builds replication commands with every identifier and literal quoted. SQL sent
on ordinary connections is composed with ``psycopg.sql`` instead; replication commands
need :func:`quote_literal` because the walsender's grammar knows only standard
``'...'`` strings, while ``psycopg.sql.Literal`` renders a value holding a backslash
as an ``E'...'`` string that grammar rejects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from sparkapply.errors import ConfigError, ServerVersionError
from sparkapply.lsn import Lsn

MIN_SERVER_VERSION = 140000


@dataclass(frozen=True, slots=True)
class Protocol:
    proto_version: int
    streaming: str  # "on" or "parallel"
    two_phase: bool


def negotiate(server_version: int) -> Protocol:
    """16+ → 4/parallel/two-phase; 15 → 3/on/two-phase; 14 → 2/on; older → error."""
    if server_version >= 160000:
        return Protocol(4, "parallel", True)
    if server_version >= 150000:
        return Protocol(3, "on", True)
    if server_version >= MIN_SERVER_VERSION:
        return Protocol(2, "on", False)
    raise ServerVersionError(
        f"the publisher runs PostgreSQL {server_version // 10000}, "
        "sparkapply needs PostgreSQL 14 or newer",
        hint="upgrade the publisher; streaming of in-progress transactions needs 14+",
    )


def quote_ident(name: str) -> str:
    """``name`` as a quoted identifier (psycopg's rule: doubled quotes)."""
    return sql.Identifier(name).as_string()


def quote_literal(value: str) -> str:
    """``value`` as a standard string literal for a replication command."""
    if "\x00" in value:
        raise ConfigError(
            "a replication command cannot hold a NUL character",
            hint="check the slot, publication and origin names in [source]",
        )
    return "'" + value.replace("'", "''") + "'"


def start_replication_command(
    slot: str,
    start: Lsn,
    publications: Sequence[str],
    protocol: Protocol,
    *,
    origin: str = "any",
    messages: bool = True,
) -> str:
    options = [
        ("proto_version", str(protocol.proto_version)),
        ("publication_names", ",".join(quote_ident(p) for p in publications)),
        ("streaming", protocol.streaming),
        ("messages", "true" if messages else "false"),
    ]
    if protocol.two_phase:
        options.append(("two_phase", "on"))
    if protocol.proto_version >= 4:  # 'origin' exists since PostgreSQL 16 / proto 4
        options.append(("origin", origin))
    rendered = ", ".join(f"{quote_ident(k)} {quote_literal(v)}" for k, v in options)
    return f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL {start} ({rendered})"


def create_slot_command(
    slot: str, *, two_phase: bool, snapshot: str = "nothing", failover: bool = False
) -> str:
    opts = [f"SNAPSHOT {quote_literal(snapshot)}"]
    if two_phase:
        opts.append("TWO_PHASE true")
    if failover:  # PostgreSQL 17+: the slot is synced to standbys (sync_replication_slots)
        opts.append("FAILOVER true")
    return f"CREATE_REPLICATION_SLOT {quote_ident(slot)} LOGICAL pgoutput ({', '.join(opts)})"


def alter_slot_failover_command(slot: str) -> str:
    return f"ALTER_REPLICATION_SLOT {quote_ident(slot)} (FAILOVER true)"
