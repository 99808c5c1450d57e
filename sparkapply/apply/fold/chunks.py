"""A batch's spool chunks, read and indexed once for all the tables that read them.

A transaction's changes to every table it touches sit in one spool segment, and each
table's task reads the whole segment and keeps its own records. A batch of 20,000
pgbench transactions is four tables' tasks over the same 40 MB, each reading and
indexing all of it (``ChunkIndex``: tags, relation ids): a sixth of the batch folded
on the driver (py-spy). Inside :func:`shared`, the tasks that run one after another in
this thread (the driver's small batches; an executor's partition of several tables)
read a segment once. Outside it, every read is fresh.

Only within one batch: a spool region is immutable while its transactions are
applied, but not for ever (a streamed transaction's aborted subtransaction is
truncated and its bytes written over). And only up to :data:`HELD_BYTES` of segments:
past that, a segment is read a chunk at a time as outside, so that a big
transaction's task never holds its whole spool.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sparkapply.changes.spool import SpoolSegment, read_chunks
from sparkapply.pgoutput.columnar import ChunkIndex

HELD_BYTES = 64 * 1024 * 1024  # of segments held inside one ``shared`` (see above)

_local = threading.local()


class _Held:
    def __init__(self) -> None:
        self.segments: dict[tuple[str, int, int], list[ChunkIndex]] = {}
        self.nbytes = 0


def indexed_chunks(segment: SpoolSegment) -> Iterator[ChunkIndex]:
    """The segment's records, a chunk at a time, indexed."""
    held: _Held | None = getattr(_local, "held", None)
    key = (segment.path, segment.start, segment.end)
    if held is not None and key in held.segments:
        yield from held.segments[key]
        return
    if held is None or held.nbytes + segment.nbytes > HELD_BYTES:
        for chunk in read_chunks(segment):
            yield ChunkIndex.of(chunk)
        return
    indexed = [ChunkIndex.of(chunk) for chunk in read_chunks(segment)]
    held.segments[key] = indexed
    held.nbytes += segment.nbytes
    yield from indexed


@contextmanager
def shared() -> Iterator[None]:
    """Inside, a segment read in this thread is read once (see the module doc)."""
    outer = getattr(_local, "held", None)
    if outer is None:
        _local.held = _Held()
    try:
        yield
    finally:
        if outer is None:
            _local.held = None
