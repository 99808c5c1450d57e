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
