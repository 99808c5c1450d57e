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


def settle() -> None:
    """Collect once, then leave what survives out of later collections (``gc.freeze``).

    Called when a replication session starts streaming: what the process holds then
    (Spark's and pyiceberg's objects, the modules, the session's caches) lives as long
    as the session, yet every full collection walked all of it. One came due in the
    receive loop of a 20,000-transaction backlog and held it for 0.1 s. What is frozen
    is freed as usual when its count drops to zero; a cycle among it waits for the next
    session, which thaws it first.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
