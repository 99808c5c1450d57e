"""What may be acknowledged: the end LSNs of source transactions, in receive order.

An item is added when a transaction ends on the wire (commit, prepare, rollback
prepared) and marked done once it is durable (committed to Iceberg, staged, removed).
The flush LSN is the end LSN of the longest done prefix: acknowledging past an item
that is not yet durable would let the server drop WAL we still need.
"""

from __future__ import annotations

import threading
from collections import deque

from sparkapply.lsn import Lsn


class Progress:
    def __init__(self, start: Lsn) -> None:
        self._lock = threading.Lock()
        self._items: deque[list[int]] = deque()  # [end_lsn, done]
        self._flushed = Lsn(start)

    def add(self, end_lsn: int, *, done: bool) -> list[int]:
        item = [int(end_lsn), int(done)]
        with self._lock:
            self._items.append(item)
            self._advance()
        return item

    def add_many(self, end_lsns: list[Lsn]) -> list[list[int]]:
        """:meth:`add` of each, not yet done, in order (a burst of small transactions)."""
        items = [[int(end), 0] for end in end_lsns]
        with self._lock:
            self._items.extend(items)
        return items

    def mark_done(self, items: list[list[int]]) -> None:
        with self._lock:
            for item in items:
                item[1] = 1
            self._advance()

    def _advance(self) -> None:
        # A batch completes thousands of items at once: one Lsn for all of them.
        items = self._items
        top = int(self._flushed)
        while items and items[0][1]:
            end = items.popleft()[0]
            if end > top:
                top = end
        if top > self._flushed:
            self._flushed = Lsn(top)

    @property
    def flushed(self) -> Lsn:
        return self._flushed

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._items)

    def follow(self, lsn: int) -> None:
        """Nothing is pending: the durable position may follow the server's."""
        with self._lock:
            if not self._items and lsn > self._flushed:
                self._flushed = Lsn(lsn)
