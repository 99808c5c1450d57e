"""The RELATION and TYPE messages one transaction spooled, by spool offset.

WHY IT IS ITS OWN STRUCTURE
    PostgreSQL re-sends a relation's RELATION in every stream chunk once the relation
    was invalidated inside the transaction (a TRUNCATE does it), so a streamed
    transaction of n chunks can carry n copies of one description; at 64kB
    ``logical_decoding_work_mem`` a 10 GB reload is 160,000 of them. Every chunk close
    asks which descriptions are in effect at an offset, and every subtransaction abort
    cuts the history back. Walking every message so far at each of those made the
    receive path quadratic in the chunks. So:

    - a message equal to the transaction's own latest one for its relation (or type)
      is a *repeat*: it changes nothing, is not recorded, and the assembler does not
      spool it (an executor starting at any offset is handed the description in effect
      there, and one replayed in place later is the same);
    - the description in effect at an offset is one binary search per relation, so a
      look-up costs in the relations the transaction described, not in its messages;
    - a cut costs what it removes.

SUBTRANSACTION ABORTS
    Catalog messages cut off by an abort are written back after the cut (pgoutput will
    not send them again; see ``assembler.py``). Nothing that changes rows lies between
    them any more, so only the last message per relation or type matters, and only if
    it differs from what is in effect at the cut.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sparkapply.pgoutput import messages as m

CatalogMessage = m.Relation | m.Type


@dataclass(frozen=True, slots=True)
class CatalogRecord:
    """One spooled RELATION or TYPE message; ``message`` has no xid (it is the same
    description inside a stream block and out)."""

    offset: int
    payload: bytes
    in_stream: bool
    message: CatalogMessage


@dataclass(slots=True)
class _Versions:
    """The distinct successive descriptions of one relation or type, by offset."""

    offsets: list[int] = field(default_factory=list)
    messages: list[CatalogMessage] = field(default_factory=list)

    def before(self, offset: int) -> CatalogMessage | None:
        i = bisect.bisect_left(self.offsets, offset)
        return self.messages[i - 1] if i else None

    def cut(self, offset: int) -> None:
        while self.offsets and self.offsets[-1] >= offset:
            self.offsets.pop()
            self.messages.pop()


def _key(message: CatalogMessage) -> tuple[bool, int]:
    if isinstance(message, m.Relation):
        return True, message.relation_id
    return False, message.type_oid


def without_xid(message: CatalogMessage) -> CatalogMessage:
    return replace(message, xid=None) if message.xid is not None else message


class CatalogHistory:
    """The catalog messages of one transaction. ``start``: the cache entries in effect
    when the transaction first touched each relation (the assembler fills it as the
    transaction goes), which its own messages override from where they are spooled."""

    def __init__(self, start: Mapping[int, m.Relation]) -> None:
        self._start = start
        self._records: list[CatalogRecord] = []
        self._offsets: list[int] = []  # of _records, for the cut
        self._versions: dict[tuple[bool, int], _Versions] = {}

    def latest(self, message: CatalogMessage) -> CatalogMessage | None:
        """The transaction's own description of ``message``'s relation or type."""
        versions = self._versions.get(_key(message))
        return versions.messages[-1] if versions is not None else None

    def repeats(self, message: CatalogMessage) -> bool:
        """True if ``message`` (without xid) is the description already in effect."""
        return self.latest(message) == message

    def add(self, offset: int, payload: bytes, in_stream: bool, message: CatalogMessage) -> None:
        """A message spooled at ``offset``, after every one recorded so far."""
        self._records.append(CatalogRecord(offset, payload, in_stream, message))
        self._offsets.append(offset)
        versions = self._versions.setdefault(_key(message), _Versions())
        versions.offsets.append(offset)
        versions.messages.append(message)

    def relations_at(self, offset: int) -> tuple[m.Relation, ...]:
        """The descriptions an executor reading the spool from ``offset`` starts with:
        the start entries, then the transaction's own messages before ``offset``
        (those at or after it are replayed in place)."""
        rels = dict(self._start)
        for (is_relation, relid), versions in self._versions.items():
            if is_relation:
                rel = versions.before(offset)
                if isinstance(rel, m.Relation):
                    rels[relid] = rel
        return tuple(rels.values())

    def cut(self, offset: int) -> list[CatalogRecord]:
        """The spool was truncated at ``offset``: forget what was spooled from there and
        return what must be written back after it, in spool order (the caller
        :meth:`add`\\ s each at its new offset)."""
        i = bisect.bisect_left(self._offsets, offset)
        lost = self._records[i:]
        del self._records[i:]
        del self._offsets[i:]
        last: dict[tuple[bool, int], CatalogRecord] = {}
        for record in lost:
            last[_key(record.message)] = record
        for key in last:
            versions = self._versions[key]
            versions.cut(offset)
            if not versions.offsets:
                del self._versions[key]
        back = sorted(last.values(), key=lambda r: r.offset)
        return [r for r in back if not self.repeats(r.message)]
