"""The pgoutput messages (protocol versions 1-4) as frozen dataclasses.

Field names follow PostgreSQL's ``logicalrep_*`` structs. Times are microseconds since
the PostgreSQL epoch (2000-01-01 UTC), LSNs are ints (wrap in :class:`~sparkapply.lsn.Lsn`
to print). ``xid`` on relation, type and change messages is set only inside a
Stream Start ... Stream Stop block (it is not on the wire outside one).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal

# The one definition of the wire's byte values; the column-wise reader (columnar.py)
# and every reader outside pgoutput/ (the assembler's inline routing reads, the folds'
# vectorised compares) import them.

# Message tags: a message's first byte.
TAG_BEGIN = 0x42  # 'B'
TAG_COMMIT = 0x43  # 'C'
TAG_RELATION = 0x52  # 'R'
TAG_TYPE = 0x59  # 'Y'
TAG_INSERT = 0x49  # 'I'
TAG_UPDATE = 0x55  # 'U'
TAG_DELETE = 0x44  # 'D'
TAG_TRUNCATE = 0x54  # 'T'

# Which tuple follows in an Update or Delete.
TUPLE_NEW = 0x4E  # 'N'
TUPLE_KEY = 0x4B  # 'K': the replica identity's columns
TUPLE_OLD = 0x4F  # 'O': the whole old row (REPLICA IDENTITY FULL)

# TupleData column kinds, as on the wire.
KIND_NULL = 0x6E  # 'n'
KIND_UNCHANGED = 0x75  # 'u': unchanged TOASTed value, the value is not sent
KIND_TEXT = 0x74  # 't'
KIND_BINARY = 0x62  # 'b'


class Unchanged(enum.Enum):
    """The value of an unchanged TOASTed column ('u'): not sent, the target keeps its
    value. Distinct from ``None`` (SQL NULL), so a consumer that reads only
    ``TupleData.values`` cannot take one for the other. One member, pickled by name,
    so ``v is UNCHANGED`` holds on executors too."""

    UNCHANGED = "u"

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged.UNCHANGED

ColumnValue = bytes | None | Unchanged
"""One column of a row image: its bytes ('t'/'b'), None (NULL, 'n') or UNCHANGED ('u')."""


@dataclass(frozen=True, slots=True)
class TupleData:
    """One row image.

    ``kinds`` holds one byte per column (``b"n"``, ``b"u"``, ``b"t"``, ``b"b"``);
    ``values[i]`` is the column's bytes for ``t``/``b``, ``None`` for ``n`` (NULL) and
    :data:`UNCHANGED` for ``u``. Kept as two flat sequences, not a Python object per
    column, because this is the hot path of the decoder.
    """

    kinds: bytes
    values: tuple[ColumnValue, ...]

    def __len__(self) -> int:
        return len(self.kinds)

    def is_null(self, i: int) -> bool:
        return self.kinds[i] == KIND_NULL

    def is_unchanged(self, i: int) -> bool:
        return self.kinds[i] == KIND_UNCHANGED


@dataclass(frozen=True, slots=True)
class Begin:
    """BEGIN ('B'): a transaction that is decoded whole, at its commit."""

    final_lsn: int
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """COMMIT ('C'): the end of the transaction a Begin opened."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    """ORIGIN ('O'): the replication origin a transaction was replayed from."""

    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a Relation message."""

    flags: int  # 1 = part of the replica identity key
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    """RELATION ('R'): a table's published columns, sent before its first change."""

    xid: int | None
    relation_id: int
    namespace: str  # "" means pg_catalog
    name: str
    replica_identity: str  # one of "d", "n", "f", "i" (pg_class.relreplident)
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    """TYPE ('Y'): a user type's name, sent before a column of it is first used."""

    xid: int | None
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    """INSERT ('I'): the new row."""

    xid: int | None
    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """UPDATE ('U'): the new row, after the old key or row when it is sent."""

    xid: int | None
    relation_id: int
    old_kind: Literal["K", "O"] | None  # K: old key, O: old row (REPLICA IDENTITY FULL)
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """DELETE ('D'): the old key, or the whole old row."""

    xid: int | None
    relation_id: int
    old_kind: Literal["K", "O"]
    old: TupleData


TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2


@dataclass(frozen=True, slots=True)
class Truncate:
    """TRUNCATE ('T'): the tables emptied by one statement."""

    xid: int | None
    options: int
    relation_ids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """MESSAGE ('M'): what ``pg_logical_emit_message`` wrote."""

    xid: int | None
    flags: int  # 1 = transactional
    lsn: int
    prefix: str
    content: bytes

    @property
    def transactional(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class StreamStart:
    """STREAM START ('S'): a segment of a transaction still in progress begins."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """STREAM STOP ('E'): the segment ends."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """STREAM COMMIT ('c'): the streamed transaction committed."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """STREAM ABORT ('A'): the streamed transaction or one subtransaction aborted."""

    xid: int
    subxid: int
    # Present only with streaming = 'parallel' (protocol 4).
    abort_lsn: int | None = None
    abort_time: int | None = None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """BEGIN PREPARE ('b'): a transaction that is decoded whole, at its PREPARE."""

    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class _PrepareBody:
    """What Prepare and Stream Prepare carry: one layout, two messages."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare(_PrepareBody):
    """PREPARE ('P'): the end of the transaction a Begin Prepare opened."""


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    """COMMIT PREPARED ('K'): a prepared transaction committed."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    """ROLLBACK PREPARED ('r'): a prepared transaction rolled back."""

    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare(_PrepareBody):
    """STREAM PREPARE ('p'): the streamed transaction was prepared."""


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)

ChangeMessage = Insert | Update | Delete | Truncate
# PREPARE, COMMIT PREPARED and STREAM PREPARE share one body layout.
PrepareLike = Prepare | CommitPrepared | StreamPrepare
