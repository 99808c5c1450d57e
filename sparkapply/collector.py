"""Pausing Python's cyclic garbage collector around the hot loops that make many
short-lived objects and no cycles: a receive burst, a batch's planning, an executor's
fold. Measured on each: a collection over their live objects (in a process that also
holds Spark's and pyiceberg's) cost as much as the work itself."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_inside = 0  # threads inside paused()
_turned_off = False  # paused() turned the collector off (and turns it on again)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside; the collector runs again once no thread is inside.
    When it was off already, it stays off.

    Counted across threads: the receiving thread goes in and out of its pause at
    every burst while the apply thread folds a batch inside its own, and a pause that
    ended with the first thread out let collections run inside the other's loops
    (over the batch's thousands of transactions, received and still held). Between
    two batches both are out, so under a steady load the collector still runs once a
    batch."""
    global _inside, _turned_off
    with _lock:
        if _inside == 0 and gc.isenabled():
            gc.disable()
            _turned_off = True
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _turned_off:
                _turned_off = False
                gc.enable()


@contextlib.contextmanager
def settled() -> Iterator[None]:
    """Inside, what the process held on entry is left out of collections
    (``gc.freeze``); it is handed back on exit.

    Held around a replication session: what the process holds when it starts
    streaming (Spark's and pyiceberg's objects, the modules, the session's caches)
    lives as long as the session, yet every full collection walked all of it. One
    came due in the receive loop of a 20,000-transaction backlog and held it for
    0.1 s. Frozen objects are still freed when their count drops to zero; a cycle
    among them waits for the session's end. Only the young generations are
    collected first: a full collection costs 0.07 s or more, at every session.
    (Process-wide, like the collector: a session that ends hands back another's.)
    """
    gc.collect(1)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
