"""Streamed transactions being received: one spool file each, subtransaction aborts.

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

STAGING
    If a stager is attached (``staged.py``), each closed chunk, and every
    ``stage_bytes`` of a long one, is offered to it as a piece, and it hears of every
    truncation and drop, so that what it staged always matches the spool.

Which chunk is open (the Stream Start xid) is the assembler's receive state; this
module keeps the transactions themselves.
"""

from __future__ import annotations

from sparkapply.changes.open_txn import OpenTxn
from sparkapply.changes.spool import SpoolDirectory
from sparkapply.changes.staged import ClosedChunk, StreamStager
from sparkapply.pgoutput import messages as m


class StreamedTxns:
    """The streamed transactions not yet resolved, by top-level xid."""

    def __init__(self, spool: SpoolDirectory) -> None:
        self.spool = spool
        self.open: dict[int, OpenTxn] = {}

    def __len__(self) -> int:
        return len(self.open)

    def start(self, msg: m.StreamStart, stager: StreamStager | None) -> None:
        """A chunk of ``msg.xid`` begins: its transaction, created on its first chunk
        (a first segment for an xid we hold restarts it)."""
        txn = self.open.get(msg.xid)
        if txn is None or msg.first_segment:
            if txn is not None:
                txn.writer.close()
                if stager is not None:
                    stager.dropped(msg.xid)
            txn = OpenTxn(msg.xid, self.spool.new_stream(msg.xid), 0, streamed=True)
            self.open[msg.xid] = txn

    def stop(self, xid: int | None, stager: StreamStager | None) -> None:
        """The chunk of ``xid`` ends: flush the spools, offer the chunk to the stager."""
        for txn in self.open.values():
            txn.writer.flush()
        if stager is not None and xid is not None:
            offer_piece(self.open[xid], stager)

    def pop(self, xid: int) -> OpenTxn:
        """The transaction, resolved (Stream Commit or Stream Prepare), flushed."""
        txn = self.open.pop(xid, None)
        if txn is None:
            # Every chunk of it was for unpublished tables, or it was empty.
            txn = OpenTxn(xid, self.spool.new_stream(xid), 0, streamed=True)
        txn.writer.flush()
        return txn

    def abort(self, msg: m.StreamAbort, stager: StreamStager | None) -> None:
        """Stream Abort of the transaction or of one of its subtransactions."""
        txn = self.open.get(msg.xid)
        if txn is None:
            return
        if msg.subxid == msg.xid:
            del self.open[msg.xid]
            self.spool.discard(txn.writer)
            if stager is not None:
                stager.dropped(msg.xid)
            return
        offset = txn.subxacts.get(msg.subxid)
        if offset is None:
            return  # a subtransaction that changed nothing we were sent
        while txn.subxacts.popitem()[0] != msg.subxid:
            pass  # those that started after it are nested in it (see the module's doc)
        txn.writer.truncate(offset)
        if stager is not None:
            stager.truncated(txn.xid, offset)
        for record in txn.history.cut(offset):
            start = txn.writer.append(record.payload, record.in_stream)
            txn.history.add(start, record.payload, record.in_stream, record.message)


def offer_piece(txn: OpenTxn, stager: StreamStager) -> None:
    """Let the stager stage what ``txn`` spooled since its last piece (flushed)."""
    txn.writer.flush()
    txn.stage_mark = txn.writer.offset
    stager.chunk_closed(
        ClosedChunk(
            txn.xid,
            str(txn.writer.path),
            txn.writer.offset,
            sorted(txn.relation_ids),
            txn.history.relations_at,
            sorted(txn.mutated),
        )
    )
