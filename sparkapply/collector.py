"""Pausing Python's cyclic garbage collector around the hot loops that make many
short-lived objects and no cycles: a receive burst, a batch's planning, an executor's
fold. Measured on each: a collection over their live objects (in a process that also
holds Spark's and pyiceberg's) cost as much as the work itself."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside; the collector runs again after. When it was off
    already, it stays off. (Threads share the collector: whichever resumes it first
    ends another thread's pause too, which only costs time.)"""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
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
