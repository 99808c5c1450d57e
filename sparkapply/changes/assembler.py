"""Transaction assembly: pgoutput messages in, committed transactions out, in commit order.

ORDINARY TRANSACTIONS
    arrive whole and contiguous; they are appended to a shared spool file and
    referenced by byte range, so small transactions cost no file each.

RELATION CACHE
    pgoutput sends a RELATION once per connection before the first change that needs
    it, except inside streamed transactions, where it is sent again per transaction.
    So the RELATION messages of ordinary and (non-streamed) prepared transactions take
    effect when received, and those of a streamed transaction when it commits. Each
    transaction records, for every relation it touches, the cache entry in effect at
    its first change to it; with its own RELATION messages (replayed in place by the
    executor) that describes every change it holds.

THE RECEIVE LOOP
    :meth:`Assembler.feed_frames` bounds how fast a transaction is received, so it
    reads BEGIN, COMMIT and change headers inline (layouts in ``pgoutput/peek.py``)
    and spools a run of changes as one write, with no call per message. A burst's
    runs of small transactions received whole are read column-wise
    (``pgoutput/burst.py``) and spooled by one write a run (``_whole_txns``).
    Everything else goes through :meth:`Assembler.feed`, which decodes and also
    raises the errors.

Change messages (I/U/D) are only peeked here (xid and relation id); their tuples are
decoded on executors. Streamed transactions are kept in ``streamed.py``, two-phase ones
in ``twophase.py``; the stager is seen through ``staged.py``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sparkapply.changes.catalog_history import without_xid
from sparkapply.changes.open_txn import OpenTxn
from sparkapply.changes.prepared import PreparedStore
from sparkapply.changes.progress import Progress
from sparkapply.changes.spool import SpoolDirectory, SpoolSegment
from sparkapply.changes.staged import StreamStager
from sparkapply.changes.streamed import StreamedTxns, offer_piece
from sparkapply.changes.transaction import CommittedTxn, TxnKind
from sparkapply.changes.twophase import committed_prepared, prepared_entry, stage_prepared
from sparkapply.errors import ProtocolError, SparkapplyError, StateError
from sparkapply.failpoints import armed, failpoint
from sparkapply.lsn import Lsn, lsns
from sparkapply.pgoutput import Decoder, peek
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.burst import changes_end, frame_tags, u32_at, whole_run
from sparkapply.pgoutput.frames import XLOG_WAL_START
from sparkapply.pgoutput.messages import TAG_BEGIN, TAG_COMMIT, TAG_INSERT
from sparkapply.pgoutput.peek import CHANGE_TAGS, peek_change
from sparkapply.state import layout

log = logging.getLogger(__name__)

RelationMap = dict[int, m.Relation]
# A whole transaction's relation ids, their cache entries, the ids it mutates.
_Touched = tuple[frozenset[int], RelationMap, frozenset[int]]
TOUCHED_KEPT = 1024  # shapes of whole transactions remembered (``_touch_whole``)


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
        self.spool = SpoolDirectory(layout.spool_dir(work_dir))
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
        self._current: OpenTxn | None = None
        self.streams = StreamedTxns(self.spool)
        self._stream_xid: int | None = None  # the open chunk's xid (Stream Start)
        self.last_lsn = 0  # start of the last XLogData fed (for error context)
        # Shared by the transactions received whole (``_whole_txns``), so that the
        # planner does the work of a set of relations once, not per transaction: each
        # set of relation ids, as one object, with the cache entries of those
        # relations (a read-only mapping, replaced when an entry changes).
        self._start_relations: dict[frozenset[int], tuple[frozenset[int], RelationMap]] = {}
        # By a whole transaction's changes (relation ids, tags): what it touches.
        self._touched: dict[tuple[tuple[int, ...], bytes], _Touched] = {}

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
        return len(self.streams)

    def first_ready(self) -> CommittedTxn | None:
        return self.ready[0][0] if self.ready else None

    def take_ready(
        self, max_bytes: int, max_txns: int, *, through: Lsn | None = None
    ) -> list[tuple[CommittedTxn, list[int]]]:
        """Committed transactions for the next batch, in commit order (only those
        with a commit LSN at most ``through``, when it is given)."""
        self.spool.flush_shared()
        ready = self.ready
        if (
            ready
            and len(ready) <= max_txns
            and self.ready_bytes <= max_bytes
            and (through is None or ready[-1][0].commit_lsn <= through)
        ):  # all of it (commit LSNs only grow): a backlog's batch takes thousands
            out = list(ready)
            ready.clear()
            self.ready_bytes = 0
            return out
        out = []
        nbytes = 0
        while self.ready and len(out) < max_txns:
            txn = self.ready[0][0]
            if out and nbytes + txn.nbytes > max_bytes:
                break
            if through is not None and txn.commit_lsn > through:
                break
            out.append(self.ready.popleft())
            nbytes += txn.nbytes
        self.ready_bytes -= nbytes
        return out

    def release(self, txn: CommittedTxn) -> None:
        """The transaction is durable: its spool bytes are no longer needed."""
        self.release_all((txn,))

    def release_all(self, txns: Iterable[CommittedTxn]) -> None:
        """:meth:`release` of each: a batch's thousands of transactions share a few
        spool files, so each file is released once, by how many referenced it."""
        refs: dict[tuple[str, ...], int] = {}  # the run of a burst shares one tuple
        for txn in txns:
            refs[txn.cleanup] = refs.get(txn.cleanup, 0) + 1
            if txn.kind == "prepared":
                self.prepared.remove(txn.xid)
        for paths, n in refs.items():
            for path in paths:
                self.spool.release(path, n)

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
        messages of one transaction, and a run of whole small transactions, are read
        column-wise, with no call per message (``_change_run``, ``_whole_txns``) and
        handed to the spool writer as one write. Everything else, and any change these
        paths cannot vouch for (too short, outside a transaction), goes through
        :meth:`feed`, which also raises the errors.
        """
        if armed("feed"):  # the crash tests count messages
            for frame in frames:
                self.feed(frame[header:], XLOG_WAL_START.unpack_from(frame, 1)[0])
            return
        i, n = 0, len(frames)
        tags = frame_tags(frames, header)
        while i < n:
            i = self._whole_txns(frames, i, header, tags)
            i = self._change_run(frames, i, header, tags)
            if i < n:
                frame = frames[i]
                if not self._begin_or_commit(frame, header):
                    self.feed(frame[header:], XLOG_WAL_START.unpack_from(frame, 1)[0])
                i += 1

    def _whole_txns(self, frames: Sequence[memoryview], i: int, header: int, tags: bytes) -> int:
        """Spool the ordinary transactions received whole from ``frames[i]`` on, in one
        write; returns the index of the first frame it did not take.

        Under a load of small transactions (pgbench, one-row updates) this is most of
        the stream: the run is read column-wise (``pgoutput/burst.py``), and each
        transaction costs its :class:`CommittedTxn`, its segment and a look-up of
        what it touches (``_touched``). What the run does not vouch for takes the
        general path from its BEGIN.
        """
        if self._current is not None or self._stream_xid is not None:
            return i
        run = whole_run(frames, tags, i, header, self.relations)
        if run is None:
            return i
        writer = self.spool.shared()
        path = str(writer.path)
        cleanup = (path,)
        offsets = writer.extend_frames(run.changes, run.change_sizes, False)
        self._forget_stale_touched()
        touched = self._touched
        relids, change_tags, bounds = run.relation_ids, run.change_tags, run.bounds
        taken: list[CommittedTxn] = []
        for t, (xid, commit_lsn, end_lsn, commit_time) in enumerate(
            zip(run.xids, lsns(run.commit_lsns), lsns(run.end_lsns), run.commit_times, strict=True)
        ):
            c0, c1 = bounds[t], bounds[t + 1]
            key = (tuple(relids[c0:c1]), change_tags[c0:c1])
            entry = touched.get(key) or self._touch_whole(key)
            s0, s1 = offsets[c0], offsets[c1]
            taken.append(
                CommittedTxn(
                    xid,
                    commit_lsn,
                    end_lsn,
                    commit_time,
                    "commit",
                    (SpoolSegment(path, s0, s1),) if s1 > s0 else (),
                    entry[0],
                    entry[1],
                    (),
                    c1 - c0,
                    False,
                    entry[2],
                    None,
                    cleanup,
                )
            )
        self.spool.hold(path, len(taken))
        items = self.progress.add_many([t.end_lsn for t in taken])
        self.ready.extend(zip(taken, items, strict=True))
        self.ready_bytes += offsets[-1] - offsets[0]  # the transactions' segments tile it
        return run.end

    def _touch_whole(self, key: tuple[tuple[int, ...], bytes]) -> _Touched:
        """What a whole transaction with these changes (relation ids, tags) touches:
        its relation ids, the cache entries of those relations and the ids it does not
        only insert into. Shared by every transaction with the same changes, and the
        entries by every one with the same relations (see ``_start_relations``)."""
        relations = self.relations
        changed, tags = key
        relids = frozenset(changed)
        entry = self._start_relations.get(relids)
        if entry is None or any(relations[r] is not v for r, v in entry[1].items()):
            relids = entry[0] if entry is not None else relids
            entry = self._start_relations[relids] = (relids, {r: relations[r] for r in relids})
        mutated = frozenset(r for r, tag in zip(changed, tags, strict=True) if tag != TAG_INSERT)
        touched = self._touched[key] = (entry[0], entry[1], mutated)
        return touched

    def _forget_stale_touched(self) -> None:
        """Drop what ``_touched`` says of relations whose cache entry changed since
        (a RELATION message, between two runs), and all of it when it grew large
        (transactions of many shapes). Each mapping of entries is checked once."""
        touched = self._touched
        if len(touched) > TOUCHED_KEPT:
            touched.clear()
            return
        relations = self.relations
        current: dict[int, bool] = {}  # id of a mapping of entries: all still in effect
        stale = []
        for key, (_, described, _) in touched.items():
            ok = current.get(id(described))
            if ok is None:
                ok = current[id(described)] = all(
                    relations.get(r) is v for r, v in described.items()
                )
            if not ok:
                stale.append(key)
        for key in stale:
            del touched[key]

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

    def _change_run(self, frames: Sequence[memoryview], i: int, header: int, tags: bytes) -> int:
        """Spool the run of change messages starting at ``frames[i]`` (``tags`` from
        :func:`frame_tags`); returns the index of the first frame it did not take.

        The run is read column-wise, as ``_whole_txns`` reads a burst's ordinary
        transactions (``pgoutput/burst.py``): its tags matched as text, each change's
        relation id (and, in a stream block, xid) read at offsets into the frames
        joined; what it touches is noted once per relation, a new subtransaction once,
        at the offset of its first change. A streamed 1,000,000-row transaction is
        that many changes, and a loop per change was a microsecond each."""
        if self._stream_xid is not None:
            txn = self.streams.open[self._stream_xid]
            in_stream = True
            need = header + peek.STREAM_CHANGE_HEAD
        elif self._current is not None:
            txn = self._current
            in_stream = False
            need = header + peek.CHANGE_HEAD
        else:
            return i
        end = changes_end(tags, i)
        if end == i:
            return i
        run = frames[i:end]
        sizes = np.fromiter(map(len, run), np.int64, end - i)
        short = np.flatnonzero(sizes < need)  # the general path says what is wrong
        if len(short):
            end = i + int(short[0])
            if end == i:
                return i
            run, sizes = run[: end - i], sizes[: end - i]
        joined = bytearray().join(run)
        relids = u32_at(joined, sizes, header + (5 if in_stream else 1))
        kinds = np.frombuffer(tags, np.uint8, end - i, i)
        for relid in _in_order(relids):
            if relid not in txn.relation_ids:
                txn.touch(relid, self.relations)
        txn.mutated.update(_in_order(relids[kinds != TAG_INSERT]))
        if in_stream:
            xids = u32_at(joined, sizes, header + 1)
            subxacts = txn.subxacts
            fresh = [
                (x, k)
                for x, k in zip(*_first_seen(xids), strict=True)
                if x != txn.xid and x not in subxacts
            ]
            offsets = txn.writer.extend_frames(joined, sizes, in_stream)
            for x, k in fresh:
                subxacts[x] = offsets[k]  # where the subtransaction starts
        else:
            txn.writer.extend_frames(joined, sizes, in_stream)
        i = end
        if len(sizes):
            txn.n_changes += len(sizes)
            stager = self.stager
            if (
                in_stream
                and stager is not None
                and stager.stage_bytes > 0
                and txn.writer.offset - txn.stage_mark >= stager.stage_bytes
            ):
                offer_piece(txn, stager)  # a long chunk is staged before its STREAM STOP
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
                txn.note_subxact(msg.xid)
            txn.writer.append(payload, msg.xid is not None)
            for relid in msg.relation_ids:
                txn.touch(relid, self.relations)
            txn.mutated.update(msg.relation_ids)
            txn.has_truncate = True
            txn.n_changes += 1
        elif isinstance(msg, m.Begin):
            self._begin(msg.xid)
        elif isinstance(msg, m.Commit):
            txn = self._end_current("COMMIT")
            self._commit(txn, msg.commit_lsn, msg.end_lsn, msg.commit_time, "commit")
        elif isinstance(msg, m.StreamStart):
            if self._current is not None:
                raise ProtocolError("STREAM START inside an ordinary transaction", tag="S")
            self.streams.start(msg, self.stager)
            self._stream_xid = msg.xid
        elif isinstance(msg, m.StreamStop):
            xid, self._stream_xid = self._stream_xid, None
            self.streams.stop(xid, self.stager)
        elif isinstance(msg, m.StreamCommit):
            txn = self.streams.pop(msg.xid)
            self._commit(txn, msg.commit_lsn, msg.end_lsn, msg.commit_time, "stream")
        elif isinstance(msg, m.StreamAbort):
            self.streams.abort(msg, self.stager)
        elif isinstance(msg, m.BeginPrepare):
            self._begin(msg.xid, prepare=msg)
        elif isinstance(msg, m.Prepare):
            self._stage(self._end_current("PREPARE"), msg)
        elif isinstance(msg, m.StreamPrepare):
            self._stage(self.streams.pop(msg.xid), msg)
        elif isinstance(msg, m.CommitPrepared):
            entry = prepared_entry(self.prepared, msg)
            committed = committed_prepared(
                entry,
                msg,
                stager=self.stager,
                proto_version=self.proto_version,
                streaming=self.streaming,
            )
            self._emit(committed, apply_own=entry.streamed)
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

    def _txn_for(self, xid: int | None, what: str) -> OpenTxn:
        if xid is not None:
            if self._stream_xid is None:
                raise ProtocolError(f"{what} with an xid outside a stream block")
            return self.streams.open[self._stream_xid]
        if self._current is None:
            raise ProtocolError(f"{what} outside a transaction", tag=what[0])
        return self._current

    def _change(self, payload: memoryview | bytes) -> None:
        in_stream = self._stream_xid is not None
        tag, xid, relid = peek_change(payload, in_stream)
        if in_stream:
            assert xid is not None and self._stream_xid is not None
            txn = self.streams.open[self._stream_xid]
            txn.note_subxact(xid)
        else:
            if self._current is None:
                raise ProtocolError("change message outside a transaction", tag=chr(tag))
            txn = self._current
        txn.writer.append(payload, in_stream)
        if relid not in txn.relation_ids:
            txn.touch(relid, self.relations)
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
        self._current = OpenTxn(xid, shared, shared.offset, prepare=prepare)

    def _end_current(self, what: str) -> OpenTxn:
        if self._current is None:
            raise ProtocolError(f"{what} without a transaction")
        txn, self._current = self._current, None
        return txn

    def _commit(
        self, txn: OpenTxn, commit_lsn: int, end_lsn: int, commit_time: int, kind: TxnKind
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
            relation_messages=txn.described(),
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

    def _stage(self, txn: OpenTxn, msg: m.Prepare | m.StreamPrepare) -> None:
        stage_prepared(
            self.prepared,
            txn,
            msg,
            spool=self.spool,
            stager=self.stager,
            proto_version=self.proto_version,
            streaming=self.streaming,
        )
        failpoint("after-stage")
        self.progress.add(msg.end_lsn, done=True)


def _first_seen(values: np.ndarray) -> tuple[list[int], list[int]]:
    """The distinct ``values``, in the order they first appear, with where each does."""
    distinct, first = np.unique(values, return_index=True)
    order = np.argsort(first, kind="stable")
    return distinct[order].tolist(), first[order].tolist()


def _in_order(values: np.ndarray) -> list[int]:
    """The distinct ``values``, in the order they first appear."""
    return _first_seen(values)[0]
