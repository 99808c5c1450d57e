"""A transaction being received: where it spools, and what it has touched so far."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkapply.changes.catalog_history import CatalogHistory
from sparkapply.changes.spool import SpoolWriter
from sparkapply.pgoutput import messages as m


@dataclass(slots=True)
class OpenTxn:
    """State of one transaction being received (ordinary, streamed or prepared)."""

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

    def note_subxact(self, xid: int) -> None:
        """Called before appending a change of ``xid``: remember where it starts."""
        if xid != self.xid and xid not in self.subxacts:
            self.subxacts[xid] = self.writer.offset

    def described(self) -> tuple[m.Relation, ...]:
        """Its RELATION messages, of the relations it changes. pgoutput also describes
        a partition whose changes it publishes as its root's (``publish_via_partition
        _root``: the root, then the partition), and no change ever names that
        partition: counted, it would be a table of the mirror that no one published."""
        if not self.relation_messages:  # most: on the receive loop's path per commit
            return ()
        ids = self.relation_ids
        return tuple(r for r in self.relation_messages if r.relation_id in ids)

    def touch(self, relid: int, relations: Mapping[int, m.Relation]) -> None:
        """The transaction changes ``relid``: record the cache entry in effect (from
        ``relations``, the relation cache) if this is its first change to it."""
        if relid not in self.start_relations:
            rel = relations.get(relid)
            if rel is not None:
                self.start_relations[relid] = rel
        self.relation_ids.add(relid)
