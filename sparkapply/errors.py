"""The one exception tree of sparkapply.

Every error is picklable (it crosses from Spark executors to the driver), carries
where it happened (xid, LSN, relation, column) and is classified by what the caller
should do about it: retry (transient), ask an operator (operator), or stop (fatal).
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

from sparkapply.lsn import format_lsn


class ErrorKind(enum.Enum):
    TRANSIENT = "transient"  # retry with backoff: a dropped connection, a busy catalog
    OPERATOR = "operator"  # needs a person: a missing publication, a bad config
    FATAL = "fatal"  # a bug or corrupt input: stop, keep everything not acknowledged


_CONTEXT_ORDER = (
    "xid",
    "lsn",
    "lsns",
    "relation",
    "column",
    "table",
    "key",
    "tag",
    "offset",
)


class SparkapplyError(Exception):
    """Base of every sparkapply error.

    ``context`` holds where it happened; ``hint`` says what to do. ``str()`` renders
    both, so a log line alone is enough to act on.
    """

    kind: ClassVar[ErrorKind] = ErrorKind.FATAL

    def __init__(self, message: str, *, hint: str | None = None, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.context = {k: v for k, v in context.items() if v is not None}

    def with_context(self, **context: Any) -> SparkapplyError:
        """Add context that a caller higher up knows (e.g. the xid) and return self."""
        for k, v in context.items():
            if v is not None and k not in self.context:
                self.context[k] = v
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.hint, dict(self.context)))

    def __str__(self) -> str:
        parts = []
        for key in sorted(self.context, key=_context_rank):
            value = self.context[key]
            if key == "lsn":
                value = format_lsn(value) if isinstance(value, int) else value
            parts.append(f"{key} {value}")
        text = self.message
        if parts:
            text += " (" + ", ".join(parts) + ")"
        if self.hint:
            text += f"\nHINT: {self.hint}"
        return text


def _context_rank(key: str) -> tuple[int, str]:
    try:
        return (_CONTEXT_ORDER.index(key), key)
    except ValueError:
        return (len(_CONTEXT_ORDER), key)


def _rebuild(
    cls: type[SparkapplyError], message: str, hint: str | None, context: dict[str, Any]
) -> SparkapplyError:
    err = cls.__new__(cls)
    SparkapplyError.__init__(err, message, hint=hint, **context)
    return err


class ProtocolError(SparkapplyError):
    """Malformed or out-of-place pgoutput / walsender bytes."""

    def __init__(
        self,
        message: str,
        *,
        tag: str | None = None,
        offset: int | None = None,
        hint: str | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message, hint=hint, tag=tag, offset=offset, **context)

    @property
    def tag(self) -> str | None:
        return self.context.get("tag")

    @property
    def offset(self) -> int | None:
        return self.context.get("offset")


class ConfigError(SparkapplyError):
    """A bad or unknown configuration key or value; ``key`` names it."""

    kind = ErrorKind.OPERATOR


class SourceError(SparkapplyError):
    """The publisher cannot be replicated from as configured."""

    kind = ErrorKind.OPERATOR


class ServerVersionError(SourceError):
    """The publisher's PostgreSQL is too old."""


class PublicationError(SourceError):
    """A publication is missing or publishes something unusable."""


class SlotError(SourceError):
    """The replication slot is missing, busy or of the wrong kind."""


class SlotBusyError(SlotError):
    """The slot is still held by a walsender of an earlier session (after a dead
    connection, the server lets go only at its wal_sender_timeout): trying again fixes it."""

    kind = ErrorKind.TRANSIENT


class PrivilegeError(SourceError):
    """The login lacks a privilege replication needs (REPLICATION, SELECT)."""


class ConnectionLostError(SparkapplyError):
    """The replication connection dropped; reconnecting may fix it."""

    kind = ErrorKind.TRANSIENT


class ReplicaIdentityError(SparkapplyError):
    """A table cannot be applied by key (no replica identity)."""

    kind = ErrorKind.OPERATOR


class ConversionError(SparkapplyError):
    """A PostgreSQL value or type cannot be represented in Iceberg."""


class UnsupportedTypeError(ConversionError):
    """A PostgreSQL type has no Iceberg mapping."""

    kind = ErrorKind.OPERATOR


class SchemaChangeError(SparkapplyError):
    """A schema change Iceberg cannot follow (e.g. a narrowing type change)."""

    kind = ErrorKind.OPERATOR


class InternalError(SparkapplyError):
    """An unexpected exception in sparkapply's own code: a bug. It names the table and
    the LSN range it was applying; skipping a transaction is not offered, because no
    transaction's content is known to be at fault (report it instead)."""


class ApplyError(SparkapplyError):
    """A change could not be applied (e.g. it refers to an unknown relation)."""


class NotInsertOnly(ApplyError):
    """Changes read as inserts only hold an UPDATE, DELETE or TRUNCATE after all."""


class CopyError(SparkapplyError):
    """The initial copy (or a resync) of a table failed; ``table`` names it."""


class TableMovedError(CopyError):
    """A table was renamed or dropped while it was being copied. The next session
    copies what is published then, under the names it has then."""

    kind = ErrorKind.TRANSIENT


class SinkError(SparkapplyError):
    """The Iceberg catalog or table refused a write."""


class CredentialError(SinkError):
    """The catalog refused the credentials it was given (missing, wrong or expired)."""

    kind = ErrorKind.OPERATOR


class CommitConflictError(SinkError):
    """The commit did not land because the table changed under it; re-plan the batch."""

    kind = ErrorKind.TRANSIENT


class CommitOutcomeUnknownError(SinkError):
    """The catalog failed mid-commit; re-load the table to learn whether it landed."""

    kind = ErrorKind.TRANSIENT


class SparkJobError(SparkapplyError):
    """A Spark job failed outside our task code (an executor lost, the job cancelled);
    running the batch again may succeed."""

    kind = ErrorKind.TRANSIENT


class DiskFullError(SparkapplyError):
    """The file system under ``work_dir`` is full (or a quota is reached)."""

    kind = ErrorKind.OPERATOR


class StateError(SparkapplyError):
    """Staged state on disk (spool, prepared store) is missing or corrupt."""


class CutError(SparkapplyError):
    """A cut that does not exist, or cannot be made (``sparkapply cut``)."""

    kind = ErrorKind.OPERATOR


class CutPassedError(CutError):
    """No exact cut can be made at an LSN: the mirror already holds transactions after it."""


class LocationError(SinkError):
    """A warehouse, table or file location that cannot be used (see location.py)."""

    kind = ErrorKind.OPERATOR


class SinkArgumentError(SinkError, ValueError):
    """A caller passed the sink an argument it cannot take (a bug in the caller, not in
    the data): e.g. a naive datetime, a file both added and removed. Also a ValueError,
    as Python code expects of a bad argument."""


class UnrepresentableValueError(ConversionError, ValueError):
    """A valid PostgreSQL value with no Iceberg representation (e.g. a multi-dimensional
    array); the hint says how to publish it instead. A ValueError too, so the
    vectorised converters treat it like any value they cannot parse."""

    kind = ErrorKind.OPERATOR
