"""A committed source transaction, as handed from the assembler to the apply."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import field
from typing import Literal

from sparkapply.changes.spool import SpoolSegment
from sparkapply.changes.staged import Staged
from sparkapply.frozen import hot_frozen
from sparkapply.lsn import Lsn
from sparkapply.pgoutput.messages import Relation

TxnKind = Literal["commit", "stream", "prepared"]


@hot_frozen  # one per transaction on the receiving thread: see sparkapply/frozen.py
class CommittedTxn:
    """Everything the apply needs of one transaction, in commit order.

    ``relations`` is the relation cache *as of the transaction's start in apply
    order* for every relation it touches; RELATION messages inside the transaction are
    in the spool and replayed by the executor in place.
    """

    xid: int
    commit_lsn: Lsn  # the commit (or COMMIT PREPARED) record: ordering and replay skip
    end_lsn: Lsn  # acknowledged once this transaction is durable
    commit_time: int
    kind: TxnKind
    segments: tuple[SpoolSegment, ...]
    relation_ids: frozenset[int]
    relations: Mapping[int, Relation]
    relation_messages: tuple[Relation, ...]  # RELATION messages inside, in order
    n_changes: int
    has_truncate: bool = False
    # Relations this transaction updated, deleted from or truncated (None: unknown).
    # A table no transaction of a batch mutates is appended to without reading it.
    mutated_relation_ids: frozenset[int] | None = None
    gid: str | None = None
    # Files that may be deleted once this transaction is durable.
    cleanup: tuple[str, ...] = field(default=())
    # A streamed transaction's pieces staged while it arrived (staging/stager.py; the
    # apply opens it, changes/ only carries it: see staged.py).
    staged: Staged | None = field(default=None, compare=False)

    @property
    def nbytes(self) -> int:
        """Spooled bytes. Computed when asked, not when made: the receiving thread
        makes one of these per transaction (a ``__post_init__`` was 0.35 µs of each),
        and only a batch cut that cannot take the whole backlog asks."""
        segments = self.segments  # one segment, or none, but for a streamed transaction
        return segments[0].nbytes if len(segments) == 1 else sum(s.nbytes for s in segments)


def relation_changes(batch: Iterable[CommittedTxn]) -> Iterator[tuple[int, CommittedTxn]]:
    """(index, transaction) of each transaction of ``batch`` whose relations are not
    the one before's: another mapping of cache entries, or RELATION messages of its
    own. A pass over a batch's relations need look at no other.

    Transactions received whole share one mapping of cache entries per set of
    relations (``changes/assembler.py``), so of a batch of 20,000 pgbench
    transactions this yields a few, where each pass over the batch once looked at
    80,000 relations.
    """
    last: Mapping[int, Relation] | None = None
    for i, txn in enumerate(batch):
        if txn.relations is last and not txn.relation_messages:
            continue
        last = txn.relations
        yield i, txn


def relations_named(batch: Iterable[CommittedTxn]) -> list[Relation]:
    """Every relation ``batch`` names (its transactions' cache entries and RELATION
    messages), each object once, in the order first named."""
    out: dict[int, Relation] = {}
    for _, txn in relation_changes(batch):
        for rel in (*txn.relations.values(), *txn.relation_messages):
            out.setdefault(id(rel), rel)
    return list(out.values())
