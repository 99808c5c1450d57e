"""What each table of a batch applies: pure planning, before any table is loaded.

A batch is a list of committed transactions in source commit order. Planning answers,
per Iceberg table, without I/O:

- which relation versions the table passes through, in apply order (each one is an
  evolution of the table's schema, at the commit LSN of the transaction that brought
  it);
- which of the batch's transactions touch it (its lane, see :mod:`.lanes`), less
  those at or below the LSN the table already holds (a replay after a restart);
- whether those transactions only insert into it (then the task need not locate
  rows, and pieces staged while the transactions arrived can be used as they are);
- how its changes name their rows: by key, by whole image (REPLICA IDENTITY FULL),
  by nothing (no identity: insert-only), or in more than one way.

A batch is first cut into identity epochs: a table's changes within one part name
their rows one way (see :func:`identity_epochs`).

The run (:mod:`sparkapply.run.batch`) loads the tables, lists their live files
and turns each :class:`TablePlan` into a Spark task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sparkapply.changes.transaction import CommittedTxn, relation_changes
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import messages as m
from sparkapply.plan.lanes import lanes

TableIdent = tuple[str, str]
IdentityOf = tuple[bool, tuple[str, ...]]  # (REPLICA IDENTITY FULL, key column names)
# How a task names a table's rows: by key, by whole image, not at all (insert-only),
# or in more than one way within the batch (the row-wise fold sorts it out).
Identity = Literal["key", "full", "none", "mixed"]


def full_identity(rel: m.Relation) -> m.Relation:
    """REPLICA IDENTITY FULL flags every column as key; it has no key to index by."""
    if rel.replica_identity != "f":
        return rel
    cols = tuple(m.RelationColumn(0, c.name, c.type_oid, c.type_modifier) for c in rel.columns)
    return m.Relation(rel.xid, rel.relation_id, rel.namespace, rel.name, rel.replica_identity, cols)


def identity_of(rel: m.Relation) -> IdentityOf:
    """How a relation version's changes name their rows: by key columns, by whole
    image (FULL), or not at all (no identity: insert-only)."""
    if rel.replica_identity == "f":
        return True, ()
    return False, tuple(c.name for c in rel.columns if c.is_key)


def identity_kind(identities: set[IdentityOf]) -> Identity:
    """How the task names a table's rows, from the identities of its versions."""
    if len(identities) > 1:
        return "mixed"
    ((full, key),) = identities
    return "full" if full else "key" if key else "none"


def identity_epochs(batch: Sequence[CommittedTxn]) -> list[Sequence[CommittedTxn]]:
    """``batch`` cut before every transaction that brings a new replica identity for
    a relation an earlier transaction of the same part used, so that within a part
    every table's changes name their rows one way (PostgreSQL's subscriber, too,
    applies each change by the identity of the relation version it came with).

    A transaction that changes the identity while it writes to the table (DDL
    between its changes) is the fold's to detect (see ``apply/fold/rowwise.py``)."""
    parts: list[Sequence[CommittedTxn]] = []
    start = 0
    # The relation each id had last in this part: transactions share cache entries,
    # so an identity is compared only when the entry is another object (per batch of
    # 20,000 transactions on 4 tables: 63 ms -> a few).
    seen: dict[int, m.Relation] = {}
    for i, txn in relation_changes(batch):
        rels = (*txn.relations.values(), *txn.relation_messages)
        if i > start and _changes_identity(seen, rels):
            parts.append(batch[start:i])
            start = i
            seen = {}
        for rel in rels:
            seen[rel.relation_id] = rel
    parts.append(batch[start:])
    return parts


def _changes_identity(seen: dict[int, m.Relation], rels: Sequence[m.Relation]) -> bool:
    """Whether ``rels`` (in order) give a relation of ``seen`` another identity."""
    last = dict(seen)
    for rel in rels:
        prev = last.get(rel.relation_id)
        if prev is not None and prev is not rel and identity_of(prev) != identity_of(rel):
            return True
        last[rel.relation_id] = rel
    return False


@dataclass(slots=True)
class RelationVersions:
    """The relation versions of a batch, per table, in apply order: each with the
    commit LSN of the transaction that brought it (a schema evolution of the table)."""

    by_table: dict[TableIdent, list[tuple[m.Relation, Lsn]]] = field(default_factory=dict)
    table_of: dict[int, TableIdent] = field(default_factory=dict)  # relation id → table

    def relation_ids(self, ident: TableIdent) -> frozenset[int]:
        return frozenset(rid for rid, t in self.table_of.items() if t == ident)


def relation_versions(
    batch: Sequence[CommittedTxn], identifier: Callable[[m.Relation], TableIdent]
) -> RelationVersions:
    out = RelationVersions()
    last_seen: dict[int, m.Relation] = {}  # the relation object each id had last
    for _, txn in relation_changes(batch):
        for rel in [*txn.relations.values(), *txn.relation_messages]:
            if last_seen.get(rel.relation_id) is rel:
                continue  # the same cache entry as the previous transaction's
            last_seen[rel.relation_id] = rel
            ident = identifier(rel)
            out.table_of[rel.relation_id] = ident
            seen = out.by_table.setdefault(ident, [])
            if (
                not seen
                or seen[-1][0].columns != rel.columns
                or seen[-1][0].replica_identity != rel.replica_identity
            ):
                seen.append((rel, txn.commit_lsn))
    return out


@dataclass(frozen=True, slots=True)
class TablePlan:
    """One table's share of a batch."""

    ident: TableIdent
    relation_ids: frozenset[int]
    ordinals: tuple[int, ...]  # the transactions it applies, by position in the batch
    insert_only: bool  # none of them updates, deletes or truncates it
    identity: Identity
    key_names: tuple[str, ...]  # of its newest relation version

    @property
    def name(self) -> str:
        return ".".join(self.ident)


@dataclass(frozen=True, slots=True)
class BatchPlan:
    tables: tuple[TablePlan, ...]
    skipped: int  # transactions of a table at or below the LSN it already holds


def plan_batch(
    batch: Sequence[CommittedTxn],
    versions: RelationVersions,
    applied: Callable[[TableIdent], Lsn],
) -> BatchPlan:
    """Each table's share of ``batch`` (one identity epoch), given the LSN each table
    already holds; tables with nothing left to apply are left out."""
    names = {rid: ".".join(ident) for rid, ident in versions.table_of.items()}
    table_lanes = lanes(batch, names.__getitem__)
    plans: list[TablePlan] = []
    skipped = 0
    for ident, rels in versions.by_table.items():
        held = applied(ident)
        lane = table_lanes.get(".".join(ident), [])
        if lane and batch[lane[0]].commit_lsn > held:
            ordinals = tuple(lane)  # the usual case: none of it applied yet
        else:
            ordinals = tuple(o for o in lane if batch[o].commit_lsn > held)
        skipped += len(lane) - len(ordinals)
        if not ordinals:
            continue
        relids = versions.relation_ids(ident)
        plans.append(
            TablePlan(
                ident=ident,
                relation_ids=relids,
                ordinals=ordinals,
                insert_only=_only_inserts(batch, ordinals, relids),
                identity=identity_kind({identity_of(r) for r, _ in rels}),
                key_names=tuple(c.name for c in full_identity(rels[-1][0]).columns if c.is_key),
            )
        )
    return BatchPlan(tuple(plans), skipped)


def _only_inserts(
    batch: Sequence[CommittedTxn], ordinals: Sequence[int], relids: frozenset[int]
) -> bool:
    """No transaction at ``ordinals`` updates, deletes from or truncates the table.
    Transactions received whole share the set of what they mutate: each set is
    looked at once in a row of them."""
    last: frozenset[int] | None = None
    for o in ordinals:
        mutated = batch[o].mutated_relation_ids
        if mutated is None:
            return False
        if mutated is last:
            continue
        if not relids.isdisjoint(mutated):
            return False
        last = mutated
    return True
