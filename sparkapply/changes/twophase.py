"""Two-phase transactions: a received PREPARE made durable, a COMMIT PREPARED emitted.

TWO-PHASE
    Begin Prepare … Prepare (or Stream Prepare) stages the transaction in the durable
    :class:`PreparedStore`, keyed by xid, and its end LSN becomes acknowledgeable.
    Commit Prepared turns the staged entry into a committed transaction at the commit
    position; Rollback Prepared deletes it (unknown xid: no-op).

    The entry keeps the transaction's relation descriptions as RELATION payloads (those
    in effect at its first change to each relation, and its own), since the relation
    cache of the session that prepared it may be gone when it commits.
"""

from __future__ import annotations

from sparkapply.changes.open_txn import OpenTxn
from sparkapply.changes.prepared import PreparedEntry, PreparedStore
from sparkapply.changes.spool import SpoolDirectory
from sparkapply.changes.staged import StreamStager
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.errors import StateError
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import Decoder, encode
from sparkapply.pgoutput import messages as m


def stage_prepared(
    store: PreparedStore,
    txn: OpenTxn,
    msg: m.Prepare | m.StreamPrepare,
    *,
    spool: SpoolDirectory,
    stager: StreamStager | None,
    proto_version: int,
    streaming: str,
) -> None:
    """Make the prepared ``txn`` durable in ``store`` (its spool is moved or linked in)."""
    is_stream = spool.is_stream(txn.writer)
    segment = txn.writer.segment(txn.start)
    # Its pieces wait for COMMIT PREPARED; those still running read the spool by
    # its name, which the stager removes once they are done: so the prepared store
    # links it first, and only then does the stager learn of the PREPARE.
    held = txn.streamed and stager is not None and stager.holds(msg.xid)
    path = str(txn.writer.path)
    txn.writer.flush()
    if is_stream:
        txn.writer.close()

    def wire(rel: m.Relation) -> bytes:
        return encode(rel, proto_version=proto_version, streaming=streaming)

    store.stage(
        xid=msg.xid,
        gid=msg.gid,
        prepare_lsn=msg.prepare_lsn,
        end_lsn=msg.end_lsn,
        prepare_time=msg.prepare_time,
        n_changes=txn.n_changes,
        has_truncate=txn.has_truncate,
        relation_ids=frozenset(txn.relation_ids),
        mutated_relation_ids=frozenset(txn.mutated),
        start_relations=tuple(wire(r) for r in txn.start_relations.values()),
        own_relations=tuple(wire(r) for r in txn.described()),
        streamed=txn.streamed,
        source=segment,
        move=is_stream,
        keep_source=held,
    )
    if txn.streamed and stager is not None:
        stager.prepared(msg.xid, path)


def prepared_entry(store: PreparedStore, msg: m.CommitPrepared) -> PreparedEntry:
    """The staged entry COMMIT PREPARED ``msg`` commits (a StateError if there is none)."""
    entry = store.get(msg.xid)
    if entry is None:
        raise StateError(
            f"COMMIT PREPARED of xid {msg.xid} (gid {msg.gid!r}) but that transaction "
            "was never staged",
            xid=msg.xid,
            lsn=msg.commit_lsn,
            hint="the work_dir's prepared/ directory was lost or belongs to another "
            "slot; drop the slot and resync",
        )
    return entry


def committed_prepared(
    entry: PreparedEntry,
    msg: m.CommitPrepared,
    *,
    stager: StreamStager | None,
    proto_version: int,
    streaming: str,
) -> CommittedTxn:
    """The committed transaction of a staged ``entry``, at COMMIT PREPARED ``msg``."""
    decoder = Decoder(proto_version=proto_version, streaming=streaming)

    def rels(payloads: tuple[bytes, ...]) -> list[m.Relation]:
        out = []
        for payload in payloads:
            rel = decoder.decode(payload)
            if not isinstance(rel, m.Relation):
                raise StateError(f"staged RELATION of xid {entry.xid} is not a RELATION")
            out.append(rel)
        return out

    staged = None
    if entry.streamed and stager is not None:
        described = {r.relation_id: r for r in rels(entry.start_relations)}
        described.update((r.relation_id, r) for r in rels(entry.own_relations))
        staged = stager.commit_prepared(
            entry.xid, entry.spool_path, entry.spool_size, tuple(described.values())
        )
    return CommittedTxn(
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
