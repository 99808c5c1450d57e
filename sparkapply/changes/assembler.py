"""Transaction assembly: pgoutput messages in, committed transactions out, in commit order.

STREAMED TRANSACTIONS
    With ``streaming`` on, a large transaction arrives in chunks (Stream Start xid …
    Stream Stop), interleaved with other streamed chunks and with whole ordinary
    transactions, and is resolved later by Stream Commit, Stream Abort or Stream
    Prepare. Each top-level xid gets its own spool file. As in PostgreSQL's
    ``worker.c`` (``subxact_info_add``), we remember the offset of the first change of
    every subtransaction; a Stream Abort of a subtransaction truncates the file back to
    that offset and forgets that subtransaction and every later one. This is exact
    because a subtransaction can only be aborted while open, so everything after its
    first change belongs to it or to subtransactions nested in it. Abort of the top
    xid deletes the file. Aborts that arrive child first, or for subtransactions that
    changed nothing, need no special case: an unknown subxid is a no-op.

    RELATION and TYPE messages cut off by a subtransaction abort are written back after
    the truncation point: pgoutput will not send them again in this transaction, and a
    stale description is corrected by the one pgoutput resends after the invalidation
    that a rolled-back DDL causes. TRUNCATE and row changes are discarded.

    pgoutput may also send the same RELATION again in every chunk (after a TRUNCATE in
    the transaction); what is done per chunk and per abort costs in the transaction's
    distinct descriptions, never in its messages so far (``catalog_history.py``).

ORDINARY TRANSACTIONS
    arrive whole and contiguous; they are appended to a shared spool file and
    referenced by byte range, so small transactions cost no file each.

TWO-PHASE
    Begin Prepare … Prepare (or Stream Prepare) stages the transaction in the durable
    :class:`PreparedStore`, keyed by xid, and its end LSN becomes acknowledgeable.
    Commit Prepared turns the staged entry into a committed transaction at the commit
    position; Rollback Prepared deletes it (unknown xid: no-op).

RELATION CACHE
    pgoutput sends a RELATION once per connection before the first change that needs
    it, except inside streamed transactions, where it is sent again per transaction.
    So the RELATION messages of ordinary and (non-streamed) prepared transactions take
    effect when received, and those of a streamed transaction when it commits. Each
    transaction records, for every relation it touches, the cache entry in effect at
    its first change to it; with its own RELATION messages (replayed in place by the
    executor) that describes every change it holds.

Change messages (I/U/D) are only peeked here (xid and relation id); their tuples are
decoded on executors.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sparkapply.changes.catalog_history import CatalogHistory, without_xid
from sparkapply.changes.prepared import PreparedEntry, PreparedStore
from sparkapply.changes.progress import Progress
from sparkapply.changes.spool import RECORD_OVERHEAD, SpoolDirectory, SpoolWriter
from sparkapply.changes.transaction import CommittedTxn, TxnKind
from sparkapply.errors import ProtocolError, SparkapplyError, StateError
from sparkapply.failpoints import armed, failpoint
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import Decoder, encode, peek
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.frames import XLOG_WAL_START
from sparkapply.pgoutput.peek import CHANGE_TAGS, peek_change

if TYPE_CHECKING:
    from sparkapply.apply.stager import StagedWork

log = logging.getLogger(__name__)

TAG_INSERT, TAG_BEGIN, TAG_COMMIT = m.TAG_INSERT, m.TAG_BEGIN, m.TAG_COMMIT


@dataclass(slots=True)
class _OpenTxn:
    """State of one transaction being received."""

    xid: int
    writer: SpoolWriter
    start: int
    relation_ids: set[int] = field(default_factory=set)
    relation_messages: list[m.Relation] = field(default_factory=list)
    # subxid -> offset of its first change, in the order they started: an abort pops
    # its subtransaction and every later one from the end.
    subxacts: dict[int, int] = field(default_factory=dict)
    # Cache entries in effect when the transaction first touched each relation.
    start_relations: dict[int, m.Relation] = field(default_factory=dict)
    history: CatalogHistory = field(init=False)
    streamed: bool = False
    n_changes: int = 0
    has_truncate: bool = False
    mutated: set[int] = field(default_factory=set)  # relids with UPDATE/DELETE/TRUNCATE
    stage_mark: int = 0  # spool offset when the stager was last offered a piece
    prepare: m.BeginPrepare | None = None  # set for Begin Prepare … Prepare

    def __post_init__(self) -> None:
        self.history = CatalogHistory(self.start_relations)


class StreamStager(Protocol):
    """Where streamed chunks go as they close (``apply/stager.py``); the assembler
    tells it what the spool of each streamed transaction becomes."""

    stage_bytes: int  # also offered a piece within a chunk, every this many bytes

    def chunk_closed(
        self,
        xid: int,
        path: str,
        end: int,
        relation_ids: Sequence[int],
        relations_at: Callable[[int], tuple[m.Relation, ...]],
        mutated: Sequence[int] = (),
    ) -> None: ...

    def truncated(self, xid: int, offset: int) -> None: ...

    def dropped(self, xid: int, *, for_good: bool = False) -> None: ...

    def committed(
        self, xid: int, path: str, end: int, relations_at: Callable[[int], tuple[m.Relation, ...]]
    ) -> StagedWork | None: ...

    def holds(self, xid: int) -> bool: ...

    def prepared(self, xid: int, path: str) -> bool: ...

    def commit_prepared(
        self, xid: int, path: str, end: int, relations: tuple[m.Relation, ...]
    ) -> StagedWork | None: ...

    def rolled_back(self, xid: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Backlog:
    """What the assembler holds that the batch scheduler decides on."""

    transactions: int  # committed, not yet taken for a batch
    nbytes: int  # their spooled bytes
    receiving: bool  # an ordinary transaction is half received (its end is not known)


class Assembler:
    def __init__(
        self,
        work_dir: Path,
        *,
        proto_version: int,
        streaming: str,
        prepared: PreparedStore,
        progress: Progress,
        stager: StreamStager | None = None,
    ) -> None:
        self.spool = SpoolDirectory(work_dir / "spool")
        self.stager = stager
        self.proto_version = proto_version
        self.streaming = streaming
        self.decoder = Decoder(proto_version=proto_version, streaming=streaming)
        self.prepared = prepared
        self.progress = progress
        self.relations: dict[int, m.Relation] = {}
        self.types: dict[int, m.Type] = {}
        self.ready: deque[tuple[CommittedTxn, list[int]]] = deque()
        self.ready_bytes = 0
        self._current: _OpenTxn | None = None
        self._streams: dict[int, _OpenTxn] = {}
        self._stream_xid: int | None = None
        self.last_lsn = 0  # start of the last XLogData fed (for error context)

    # -- state for the subscriber -----------------------------------------------------

    @property
    def in_transaction(self) -> bool:
        """An ordinary transaction is half received (its end is not yet known)."""
        return self._current is not None

    def backlog(self) -> Backlog:
        """The scheduler's view: what is ready for a batch and whether a transaction
        is being received."""
        return Backlog(len(self.ready), self.ready_bytes, self._current is not None)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def first_ready(self) -> CommittedTxn | None:
        return self.ready[0][0] if self.ready else None

    def take_ready(
        self, max_bytes: int, max_txns: int, *, through: Lsn | None = None
    ) -> list[tuple[CommittedTxn, list[int]]]:
        """Committed transactions for the next batch, in commit order (those with a
        commit LSN at most ``through``, if any are)."""
        self.spool.flush_shared()
        out: list[tuple[CommittedTxn, list[int]]] = []
        nbytes = 0
        while self.ready and len(out) < max_txns:
            txn = self.ready[0][0]
            if out and nbytes + txn.nbytes > max_bytes:
                break
            if through is not None and txn.commit_lsn > through and out:
                break
            out.append(self.ready.popleft())
            nbytes += txn.nbytes
        self.ready_bytes -= nbytes
        return out

    def release(self, txn: CommittedTxn) -> None:
        """The transaction is durable: its spool bytes are no longer needed."""
        for path in txn.cleanup:
            self.spool.release(path)
        if txn.kind == "prepared":
            self.prepared.remove(txn.xid)

    # -- input ----------------------------------------------------------------------

    def feed(self, payload: memoryview | bytes, lsn: int) -> None:
        """One pgoutput message, as carried by the XLogData starting at ``lsn``."""
        self.last_lsn = lsn
        failpoint("feed")
        try:
            self._feed(payload)
        except SparkapplyError as exc:
            ctx_xid = self._stream_xid or (self._current.xid if self._current else None)
            raise exc.with_context(lsn=lsn, xid=ctx_xid) from None

    def feed_frames(self, frames: Sequence[memoryview], header: int) -> None:
        """The pgoutput messages of a burst of XLogData frames, each ``header`` bytes of
        XLogData head then the message; the same as :meth:`feed` of each in turn.

        This loop bounds how fast a large transaction is received (PostgreSQL's own
        apply worker spends about a microsecond per change), so a run of change
        messages of one transaction takes a path with no call per message: read the
        routing header inline, note new subtransactions and relations, and hand the
        run to the spool writer as one write. Everything else, and any change this
        path cannot vouch for (too short, outside a transaction), goes through
        :meth:`feed`, which also raises the errors.
        """
        if armed("feed"):  # the crash tests count messages
            for frame in frames:
                self.feed(frame[header:], XLOG_WAL_START.unpack_from(frame, 1)[0])
            return
        i, n = 0, len(frames)
        while i < n:
            i = self._change_run(frames, i, header)
            if i < n:
                frame = frames[i]
                if not self._begin_or_commit(frame, header):
                    self.feed(frame[header:], XLOG_WAL_START.unpack_from(frame, 1)[0])
                i += 1

    def _begin_or_commit(self, frame: memoryview, header: int) -> bool:
        """BEGIN and COMMIT of an ordinary transaction, read inline (20,000 one-row
        transactions are 40,000 of them); False for anything :meth:`feed` must see,
        which also raises the errors (wrong length, flags, place)."""
        size = len(frame) - header
        if self._stream_xid is not None or size < peek.BEGIN_SIZE:
            return False
        tag = frame[header]
        if tag == TAG_BEGIN and size == peek.BEGIN_SIZE and self._current is None:
            self._begin(peek.U32.unpack_from(frame, header + peek.BEGIN_XID_AT)[0])
            return True
        committing = tag == TAG_COMMIT and size == peek.COMMIT_SIZE
        if committing and self._current is not None and not frame[header + 1]:
            _, commit_lsn, end_lsn, commit_time = peek.COMMIT.unpack_from(frame, header + 1)
            txn = self._end_current("COMMIT")
            self._commit(txn, commit_lsn, end_lsn, commit_time, "commit")
            return True
        return False

    def _change_run(self, frames: Sequence[memoryview], i: int, header: int) -> int:
        """Spool the run of change messages starting at ``frames[i]``; returns the
        index of the first frame it did not take."""
        if self._stream_xid is not None:
            txn = self._streams[self._stream_xid]
            in_stream = True
            need = header + peek.STREAM_CHANGE_HEAD
        elif self._current is not None:
            txn = self._current
            in_stream = False
            need = header + peek.CHANGE_HEAD
        else:
            return i
        n = len(frames)
        top = txn.xid
        subxacts = txn.subxacts
        relation_ids = txn.relation_ids
        mutated = txn.mutated
        pos = txn.writer.offset
        payloads: list[memoryview] = []
        pair = peek.U32_PAIR.unpack_from
        single = peek.U32.unpack_from
        while i < n:
            frame = frames[i]
            size = len(frame)
            if size < need:
                break
            tag = frame[header]
            if tag not in CHANGE_TAGS:
                break
            if in_stream:
                xid, relid = pair(frame, header + 1)
                if xid != top and xid not in subxacts:
                    subxacts[xid] = pos  # where the subtransaction starts
            else:
                relid = single(frame, header + 1)[0]
            if relid not in relation_ids:
                self._touch(txn, relid)
            if tag != TAG_INSERT:
                mutated.add(relid)
            payloads.append(frame[header:])
            pos += RECORD_OVERHEAD + size - header
            i += 1
        if payloads:
            txn.writer.extend(payloads, in_stream)
            txn.n_changes += len(payloads)
            stager = self.stager
            if (
                in_stream
                and stager is not None
                and stager.stage_bytes > 0
                and txn.writer.offset - txn.stage_mark >= stager.stage_bytes
            ):
                self._offer_piece(txn)  # a long chunk is staged before its STREAM STOP
        return i

    def _feed(self, payload: memoryview | bytes) -> None:
        if not payload:
            raise ProtocolError("empty pgoutput message", offset=0)
        tag = payload[0]
        if tag in CHANGE_TAGS:
            self._change(payload)
            return
        msg = self.decoder.decode(payload)
        if isinstance(msg, m.Relation | m.Type):
            self._catalog(msg, payload)
        elif isinstance(msg, m.Truncate):
            txn = self._txn_for(msg.xid, "TRUNCATE")
            if msg.xid is not None:
                self._note_subxact(txn, msg.xid)
            txn.writer.append(payload, msg.xid is not None)
            for relid in msg.relation_ids:
                self._touch(txn, relid)
            txn.mutated.update(msg.relation_ids)
            txn.has_truncate = True
            txn.n_changes += 1
        elif isinstance(msg, m.Begin):
            self._begin(msg.xid)
        elif isinstance(msg, m.Commit):
            txn = self._end_current("COMMIT")
            self._commit(txn, msg.commit_lsn, msg.end_lsn, msg.commit_time, "commit")
        elif isinstance(msg, m.StreamStart):
            self._stream_start(msg)
        elif isinstance(msg, m.StreamStop):
            xid, self._stream_xid = self._stream_xid, None
            for s in self._streams.values():
                s.writer.flush()
            if self.stager is not None and xid is not None:
                self._offer_piece(self._streams[xid])
        elif isinstance(msg, m.StreamCommit):
            txn = self._pop_stream(msg.xid, "STREAM COMMIT")
            self._commit(txn, msg.commit_lsn, msg.end_lsn, msg.commit_time, "stream")
        elif isinstance(msg, m.StreamAbort):
            self._stream_abort(msg)
        elif isinstance(msg, m.BeginPrepare):
            self._begin(msg.xid, prepare=msg)
        elif isinstance(msg, m.Prepare):
            txn = self._end_current("PREPARE")
            self._stage(txn, msg.xid, msg.gid, msg.prepare_lsn, msg.end_lsn, msg.prepare_time)
        elif isinstance(msg, m.StreamPrepare):
            txn = self._pop_stream(msg.xid, "STREAM PREPARE")
            self._stage(txn, msg.xid, msg.gid, msg.prepare_lsn, msg.end_lsn, msg.prepare_time)
        elif isinstance(msg, m.CommitPrepared):
            self._commit_prepared(msg)
        elif isinstance(msg, m.RollbackPrepared):
            self.prepared.remove(msg.xid)
            if self.stager is not None:
                self.stager.rolled_back(msg.xid)
            self.progress.add(msg.rollback_end_lsn, done=True)
        elif isinstance(msg, m.LogicalMessage):
            pass  # logical messages carry no table changes; nothing to apply
        elif isinstance(msg, m.Origin):
            pass

    # -- pieces -----------------------------------------------------------------------

    def _txn_for(self, xid: int | None, what: str) -> _OpenTxn:
        if xid is not None:
            if self._stream_xid is None:
                raise ProtocolError(f"{what} with an xid outside a stream block")
            return self._streams[self._stream_xid]
        if self._current is None:
            raise ProtocolError(f"{what} outside a transaction", tag=what[0])
        return self._current

    @staticmethod
    def _note_subxact(txn: _OpenTxn, xid: int) -> None:
        # Called before appending a change of ``xid``: remember where it starts.
        if xid != txn.xid and xid not in txn.subxacts:
            txn.subxacts[xid] = txn.writer.offset

    def _touch(self, txn: _OpenTxn, relid: int) -> None:
        if relid not in txn.start_relations:
            rel = self.relations.get(relid)
            if rel is not None:
                txn.start_relations[relid] = rel
        txn.relation_ids.add(relid)

    def _change(self, payload: memoryview | bytes) -> None:
        in_stream = self._stream_xid is not None
        tag, xid, relid = peek_change(payload, in_stream)
        if in_stream:
            assert xid is not None and self._stream_xid is not None
            txn = self._streams[self._stream_xid]
            self._note_subxact(txn, xid)
        else:
            if self._current is None:
                raise ProtocolError("change message outside a transaction", tag=chr(tag))
            txn = self._current
        txn.writer.append(payload, in_stream)
        if relid not in txn.relation_ids:
            self._touch(txn, relid)
        if tag != TAG_INSERT:
            txn.mutated.add(relid)
        txn.n_changes += 1

    def _catalog(self, msg: m.Relation | m.Type, payload: memoryview | bytes) -> None:
        in_stream = msg.xid is not None
        txn = self._txn_for(msg.xid, "RELATION") if in_stream else self._current
        if txn is None:
            # Outside any transaction (not sent by pgoutput today): takes effect now.
            if isinstance(msg, m.Relation):
                self.relations[msg.relation_id] = msg
            else:
                self.types[msg.type_oid] = msg
            return
        described = without_xid(msg)
        if txn.history.repeats(described):
            return  # already in effect (pgoutput resends it per chunk): nothing to replay
        earlier = txn.history.latest(described)
        offset = txn.writer.append(payload, in_stream)
        txn.history.add(offset, bytes(payload), in_stream, described)
        if isinstance(described, m.Relation):
            if in_stream and self.stager is not None and earlier is not None:
                self.stager.dropped(txn.xid, for_good=True)  # DDL inside the transaction
            txn.relation_messages.append(described)
            if not in_stream:
                self.relations[described.relation_id] = described  # see RELATION CACHE
        elif not in_stream:
            self.types[described.type_oid] = described

    def _begin(self, xid: int, prepare: m.BeginPrepare | None = None) -> None:
        if self._current is not None:
            raise ProtocolError(
                f"BEGIN of xid {xid} while xid {self._current.xid} is still open", tag="B"
            )
        shared = self.spool.shared()
        self._current = _OpenTxn(xid, shared, shared.offset, prepare=prepare)

    def _end_current(self, what: str) -> _OpenTxn:
        if self._current is None:
            raise ProtocolError(f"{what} without a transaction")
        txn, self._current = self._current, None
        return txn

    def _stream_start(self, msg: m.StreamStart) -> None:
        if self._current is not None:
            raise ProtocolError("STREAM START inside an ordinary transaction", tag="S")
        txn = self._streams.get(msg.xid)
        if txn is None or msg.first_segment:
            if txn is not None:
                txn.writer.close()
                if self.stager is not None:
                    self.stager.dropped(msg.xid)
            txn = _OpenTxn(msg.xid, self.spool.new_stream(msg.xid), 0, streamed=True)
            self._streams[msg.xid] = txn
        self._stream_xid = msg.xid

    def _pop_stream(self, xid: int, what: str) -> _OpenTxn:
        txn = self._streams.pop(xid, None)
        if txn is None:
            # Every chunk of it was for unpublished tables, or it was empty.
            txn = _OpenTxn(xid, self.spool.new_stream(xid), 0, streamed=True)
        txn.writer.flush()
        return txn

    def _stream_abort(self, msg: m.StreamAbort) -> None:
        txn = self._streams.get(msg.xid)
        if txn is None:
            return
        if msg.subxid == msg.xid:
            del self._streams[msg.xid]
            self.spool.discard(txn.writer)
            if self.stager is not None:
                self.stager.dropped(msg.xid)
            return
        offset = txn.subxacts.get(msg.subxid)
        if offset is None:
            return  # a subtransaction that changed nothing we were sent
        while txn.subxacts.popitem()[0] != msg.subxid:
            pass  # those that started after it are nested in it (see the module's doc)
        txn.writer.truncate(offset)
        if self.stager is not None:
            self.stager.truncated(txn.xid, offset)
        for record in txn.history.cut(offset):
            start = txn.writer.append(record.payload, record.in_stream)
            txn.history.add(start, record.payload, record.in_stream, record.message)

    def _commit(
        self, txn: _OpenTxn, commit_lsn: int, end_lsn: int, commit_time: int, kind: TxnKind
    ) -> None:
        segment = txn.writer.segment(txn.start)
        path = str(txn.writer.path)
        staged = None
        if kind == "stream":
            txn.writer.close()
            if self.stager is not None:
                staged = self.stager.committed(txn.xid, path, segment.end, txn.history.relations_at)
        self.spool.hold(path)
        committed = CommittedTxn(
            xid=txn.xid,
            commit_lsn=Lsn(commit_lsn),
            end_lsn=Lsn(end_lsn),
            commit_time=commit_time,
            kind=kind,
            segments=(segment,) if segment.nbytes else (),
            relation_ids=frozenset(txn.relation_ids),
            relations=txn.start_relations,
            relation_messages=tuple(txn.relation_messages),
            n_changes=txn.n_changes,
            has_truncate=txn.has_truncate,
            mutated_relation_ids=frozenset(txn.mutated),
            cleanup=(path,),
            staged=staged,
        )
        self._emit(committed, apply_own=txn.streamed)

    def _emit(self, txn: CommittedTxn, *, apply_own: bool) -> None:
        """Queue a committed transaction. ``apply_own``: its own RELATION messages are
        streamed-scope and take effect in the cache now, at its commit."""
        if apply_own:
            for rel in txn.relation_messages:
                self.relations[rel.relation_id] = rel
        described = txn.relations
        own = {r.relation_id for r in txn.relation_messages} if txn.relation_messages else ()
        missing = [rid for rid in txn.relation_ids if rid not in described and rid not in own]
        if missing:
            raise StateError(
                f"changes for relation id(s) {missing} arrived without a RELATION message",
                xid=txn.xid,
                hint="the stream is inconsistent; restart sparkapply to have it re-sent",
            )
        item = self.progress.add(txn.end_lsn, done=False)
        self.ready.append((txn, item))
        self.ready_bytes += txn.nbytes

    def _stage(
        self, txn: _OpenTxn, xid: int, gid: str, prepare_lsn: int, end_lsn: int, ptime: int
    ) -> None:
        is_stream = self.spool.is_stream(txn.writer)
        segment = txn.writer.segment(txn.start)
        # Its pieces wait for COMMIT PREPARED; those still running read the spool by
        # its name, which the stager removes once they are done: so the prepared store
        # links it first, and only then does the stager learn of the PREPARE.
        held = txn.streamed and self.stager is not None and self.stager.holds(xid)
        path = str(txn.writer.path)
        txn.writer.flush()
        if is_stream:
            txn.writer.close()
        self.prepared.stage(
            xid=xid,
            gid=gid,
            prepare_lsn=prepare_lsn,
            end_lsn=end_lsn,
            prepare_time=ptime,
            n_changes=txn.n_changes,
            has_truncate=txn.has_truncate,
            relation_ids=frozenset(txn.relation_ids),
            mutated_relation_ids=frozenset(txn.mutated),
            start_relations=tuple(self._encode(r) for r in txn.start_relations.values()),
            own_relations=tuple(self._encode(r) for r in txn.relation_messages),
            streamed=txn.streamed,
            source=segment,
            move=is_stream,
            keep_source=held,
        )
        if txn.streamed and self.stager is not None:
            self.stager.prepared(xid, path)
        failpoint("after-stage")
        self.progress.add(end_lsn, done=True)

    def _offer_piece(self, txn: _OpenTxn) -> None:
        """Let the stager stage what ``txn`` spooled since its last piece (flushed)."""
        assert self.stager is not None
        txn.writer.flush()
        txn.stage_mark = txn.writer.offset
        self.stager.chunk_closed(
            txn.xid,
            str(txn.writer.path),
            txn.writer.offset,
            sorted(txn.relation_ids),
            txn.history.relations_at,
            sorted(txn.mutated),
        )

    def _encode(self, rel: m.Relation) -> bytes:
        return encode(rel, proto_version=self.proto_version, streaming=self.streaming)

    def _commit_prepared(self, msg: m.CommitPrepared) -> None:
        entry = self.prepared.get(msg.xid)
        if entry is None:
            raise StateError(
                f"COMMIT PREPARED of xid {msg.xid} (gid {msg.gid!r}) but that transaction "
                "was never staged",
                xid=msg.xid,
                lsn=msg.commit_lsn,
                hint="the work_dir's prepared/ directory was lost or belongs to another "
                "slot; drop the slot and resync",
            )
        self._emit_prepared(entry, msg)

    def _emit_prepared(self, entry: PreparedEntry, msg: m.CommitPrepared) -> None:
        decoder = Decoder(proto_version=self.proto_version, streaming=self.streaming)

        def rels(payloads: tuple[bytes, ...]) -> list[m.Relation]:
            out = []
            for payload in payloads:
                rel = decoder.decode(payload)
                if not isinstance(rel, m.Relation):
                    raise StateError(f"staged RELATION of xid {entry.xid} is not a RELATION")
                out.append(rel)
            return out

        staged = None
        if entry.streamed and self.stager is not None:
            described = {r.relation_id: r for r in rels(entry.start_relations)}
            described.update((r.relation_id, r) for r in rels(entry.own_relations))
            staged = self.stager.commit_prepared(
                entry.xid, entry.spool_path, entry.spool_size, tuple(described.values())
            )
        committed = CommittedTxn(
            xid=entry.xid,
            commit_lsn=Lsn(msg.commit_lsn),
            end_lsn=Lsn(msg.end_lsn),
            commit_time=msg.commit_time,
            kind="prepared",
            segments=(entry.segment,) if entry.spool_size else (),
            relation_ids=entry.relation_ids,
            relations={r.relation_id: r for r in rels(entry.start_relations)},
            relation_messages=tuple(rels(entry.own_relations)),
            n_changes=entry.n_changes,
            has_truncate=entry.has_truncate,
            mutated_relation_ids=entry.mutated_relation_ids,
            gid=entry.gid,
            staged=staged,
        )
        self._emit(committed, apply_own=entry.streamed)
