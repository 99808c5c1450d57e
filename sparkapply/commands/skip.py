"""``sparkapply skip``: drop one transaction that cannot be applied (a poison transaction).

When a transaction cannot be applied, ``run`` stops naming its xid, commit LSN and
table, and acknowledges nothing from it on. ``sparkapply skip --lsn X/Y`` records the
skip (see :mod:`sparkapply.changes.skip`); the running or next ``run`` drops exactly
that transaction, acknowledges it and logs what it dropped. Its changes are lost for
every table it touched, as with PostgreSQL's ``ALTER SUBSCRIPTION … SKIP``: the
Iceberg tables then differ from the publisher by that transaction, until the tables
are resynchronised (``sparkapply resync``).
"""

from __future__ import annotations

import logging

import psycopg

from sparkapply.changes.prepared import pending_prepared
from sparkapply.changes.skip import SkipStore
from sparkapply.config import Config
from sparkapply.errors import ConfigError, SlotError, SourceError
from sparkapply.lsn import Lsn
from sparkapply.source.connection import connect, describe_dsn

log = logging.getLogger(__name__)


def request_skip(config: Config, lsn_text: str) -> Lsn:
    """Validate and record the skip of the transaction that finishes at ``lsn_text``."""
    try:
        lsn = Lsn.parse(lsn_text)
    except ValueError as exc:
        raise ConfigError(
            f"--lsn must be an LSN X/Y in hex, got {lsn_text!r}",
            key="--lsn",
            hint="pass the LSN the apply error names (the transaction's commit LSN)",
        ) from exc
    if lsn == 0:
        raise ConfigError("--lsn 0/0 names no transaction", key="--lsn")
    staged = any(e.prepare_lsn == lsn for e in pending_prepared(config.work_dir))
    confirmed = _confirmed(config)
    if confirmed is not None and confirmed > lsn and not staged:
        # The transaction ended at or before what the publisher was told is durable:
        # it was applied (or skipped) already and is never sent again.
        raise SlotError(
            f"the transaction at {lsn} is already acknowledged: slot "
            f"{config.source.slot!r} is confirmed up to {confirmed}",
            hint="pass the LSN the latest apply error names; `sparkapply status` shows the "
            "slot's confirmed LSN",
        )
    SkipStore(config.work_dir).request(lsn)
    log.info(
        "recorded: the transaction finishing at %s will be skipped by the running "
        "sparkapply, or by the next `sparkapply run` (in %s)",
        lsn,
        config.work_dir,
    )
    return lsn


def _confirmed(config: Config) -> Lsn | None:
    """The slot's confirmed position, or None when it cannot be read (the skip is then
    recorded unchecked: it can only ever match a transaction not yet acknowledged)."""
    src = config.source
    try:
        with connect(
            src.dsn, application_name="sparkapply skip", connect_timeout=src.connect_timeout
        ) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (src.slot,),
            ).fetchone()
    except (SourceError, psycopg.OperationalError) as exc:
        # The log names the server's own reason, as psycopg gave it.
        reason = exc.__cause__ if isinstance(exc, SourceError) and exc.__cause__ else exc
        log.warning(
            "cannot read slot %s on %s (%s); recording the skip without checking it",
            src.slot,
            describe_dsn(src.dsn),
            str(reason).strip().splitlines()[0] if str(reason).strip() else type(reason).__name__,
        )
        return None
    if row is None or row[0] is None:
        return None
    return Lsn.parse(str(row[0]))
