"""A batch's transactions as each table's task reads them: its share of the spool, and
of the pieces staged while a streamed transaction arrived.

SPANS, JOINED ONCE PER BATCH
    A task reads runs of transactions, not transactions (``apply/fold/rowwise.py``,
    :class:`~sparkapply.apply.fold.rowwise.Runs`, THE RULE): transactions back to back
    in one spool file, with one relation cache, are read as one. Joining them is a pass
    over the table's transactions, and most tables of a batch share theirs: each of a
    pgbench transaction's changes to its four tables sits in its one spool segment, so
    the four tables' tasks read the same runs. A pass per table was 80,000 steps for
    20,000 pgbench transactions, most of a batch's planning.

    So the batch joins each distinct list of transactions once, into spans: THE RULE,
    with "one relation cache" read as "the same mapping of cache entries" (the
    assembler shares one between the transactions received whole with the same
    relations). A table then takes the spans with its own cache entries, and
    :class:`Runs` joins adjacent spans whose entries for the table are equal: the
    runs a pass over the table's transactions makes, at a step per span.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from sparkapply.apply.fold.rowwise import Runs, TxnInput
from sparkapply.apply.tasks import TableResult
from sparkapply.changes.staged import PieceFiles
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.pgoutput import messages as m


class StagedShare:
    """One table's use of the pieces staged while its transactions arrived."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.files: list[str] = []
        self.rows = 0
        self.changes = 0
        self.updates = 0
        self.deletes = 0
        self.keyed: tuple[PieceFiles, ...] = ()  # pieces the task composes (fold/staged.py)

    def input(
        self,
        ordinal: int,
        txn: CommittedTxn,
        relids: frozenset[int],
        schema_id: int | None,
        *,
        keyed: bool = False,
    ) -> TxnInput:
        """The task's share of ``txn``: the spool after its staged pieces when the
        table may use them (``schema_id``: the batch only appends to it, or, with
        ``keyed``, ``txn`` is its only transaction in the batch), else all of it."""
        segments = txn.segments
        relations = relations_of(txn, relids)
        use = (
            txn.staged.use(self.table, relids, schema_id, keyed=keyed)
            if txn.staged is not None and schema_id is not None
            else None
        )
        if use is not None:
            segments = use.remainder
            relations = tuple(r for r in use.relations if r.relation_id in relids)
            self.files += use.files
            self.rows += use.rows
            self.changes += use.changes
            self.updates += use.updates
            self.deletes += use.deletes
            self.keyed += use.keyed
        return TxnInput(
            ordinal=ordinal,
            xid=txn.xid,
            commit_lsn=int(txn.commit_lsn),
            segments=segments,
            relations=relations,
        )

    def add_to(self, result: TableResult) -> None:
        result.added = [*result.added, *self.files]
        result.rows_written += self.rows
        result.n_changes += self.changes
        result.n_inserts += self.changes - self.updates - self.deletes
        result.n_updates += self.updates
        result.n_deletes += self.deletes

    def result(self, last_commit_lsn: int) -> TableResult:
        result = TableResult(self.table, last_commit_lsn=last_commit_lsn, path="staged")
        self.add_to(result)
        return result


def relations_of(txn: CommittedTxn, relids: frozenset[int]) -> tuple[m.Relation, ...]:
    """``txn``'s relation cache entries of one table."""
    if len(relids) == 1:
        (relid,) = relids
        rel = txn.relations.get(relid)
        return () if rel is None else (rel,)
    return tuple(r for rid, r in txn.relations.items() if rid in relids)


class BatchShares:
    """The tables' shares of one batch (see SPANS, JOINED ONCE PER BATCH)."""

    def __init__(self, batch: Sequence[CommittedTxn]) -> None:
        self._batch = batch
        self._spans: dict[tuple[int, ...], list[TxnInput]] = {}
        self._staged: frozenset[int] | None = None

    def inputs(
        self,
        ordinals: tuple[int, ...],
        relids: frozenset[int],
        share: StagedShare,
        schema_id: int | None,
        *,
        keyed: bool = False,
    ) -> tuple[TxnInput, ...]:
        """A table's transactions as its task reads them. With ``schema_id`` (the table
        may use staged pieces), a transaction with pieces is read through ``share``;
        the rest, and every transaction without it, from the spool."""
        batch = self._batch
        runs = Runs()
        if schema_id is not None and not self.staged().isdisjoint(ordinals):
            for o in ordinals:
                txn = batch[o]
                if txn.staged is None:
                    runs.add_one(
                        o, txn.xid, int(txn.commit_lsn), txn.segments, relations_of(txn, relids)
                    )
                else:
                    runs.add(share.input(o, txn, relids, schema_id, keyed=keyed))
            return tuple(runs.inputs())
        spans = self._spans.get(ordinals)
        if spans is None:
            spans = self._spans[ordinals] = _spans(batch, ordinals)
        entries: tuple[m.Relation, ...] | None = None
        rels: tuple[m.Relation, ...] = ()
        for span in spans:
            if span.relations is not entries:
                entries = span.relations
                rels = tuple(r for r in entries if r.relation_id in relids)
            runs.add(dataclasses.replace(span, relations=rels))
        return tuple(runs.inputs())

    def staged(self) -> frozenset[int]:
        """The ordinals of the transactions with staged pieces."""
        if self._staged is None:
            self._staged = frozenset(i for i, t in enumerate(self._batch) if t.staged is not None)
        return self._staged


def _spans(batch: Sequence[CommittedTxn], ordinals: Sequence[int]) -> list[TxnInput]:
    """The transactions at ``ordinals`` joined by :class:`Runs`, each with every cache
    entry of its mapping (one tuple per mapping): the spans every table joins further."""
    runs = Runs()
    cache: Mapping[int, m.Relation] | None = None
    entries: tuple[m.Relation, ...] = ()
    for o in ordinals:
        txn = batch[o]
        if txn.relations is not cache:
            cache = txn.relations
            entries = tuple(cache.values())
        runs.add_one(o, txn.xid, int(txn.commit_lsn), txn.segments, entries)
    return runs.inputs()
