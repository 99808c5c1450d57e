"""Receiving a streamed transaction costs the same per chunk however many came before.

After a TRUNCATE in the transaction, pgoutput sends the RELATION again in every stream
chunk (``S R I E``), and a transaction may abort a subtransaction in every chunk. The
assembler and the stager once walked every RELATION (decoding each) or every
subtransaction so far at each chunk close or abort: quadratic in the chunks.

Work is counted, not timed: the Python bytecode the receive path executes for a window
of chunks early in the transaction and for the same window much later (a timed
assertion would flake on a loaded machine). No server and no Spark: the truncated
table cannot be staged, so the real stager never starts a job.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from pyiceberg.catalog.sql import SqlCatalog

from sparkapply.changes.spool import read_records
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.pgoutput import messages as m
from sparkapply.staging.stager import Stager
from tests.changes.feed import Feed

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOP = 10
COLUMNS = (m.RelationColumn(1, "id", 23, -1), m.RelationColumn(0, "v", 25, -1))
REL = m.Relation(None, 100, "public", "t", "d", COLUMNS)
SENT = m.Relation(TOP, 100, "public", "t", "d", COLUMNS)  # as it is sent inside a chunk
EARLY, LATE, WINDOW = 50, 1500, 50  # chunks: where the two measured windows start


class Receiver(Feed):
    """The assembler with the real stager, fed encoded messages."""

    def __init__(self, tmp_path: Path) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        catalog = SqlCatalog(
            "c", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh"
        )
        self.stager = Stager(
            cast("SparkSession", None),  # no piece is ever staged here (see the module's doc)
            catalog,
            lambda rel: (rel.namespace, rel.name),
            work_dir=tmp_path,
            stage_bytes=1,  # every chunk close is a chunk the stager considers
            inflight_bytes=1 << 40,
            proto_version=4,
            streaming="parallel",
        )
        super().__init__(tmp_path, self.stager)

    def close(self) -> None:
        self.stager.close()


@dataclass
class Work:
    opcodes: int = 0  # bytecode instructions executed on this thread
    read: int = 0  # bytes the process read (Linux): a spool index read whole per abort


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@contextmanager
def counting() -> Iterator[Work]:
    work = Work()

    def trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        if event == "opcode":
            work.opcodes += 1
        return trace

    previous = sys.gettrace()
    read = _bytes_read()
    sys.settrace(trace)
    try:
        yield work
    finally:
        sys.settrace(previous)
        work.read = _bytes_read() - read


def insert(xid: int, v: int) -> m.Insert:
    return m.Insert(xid, REL.relation_id, m.TupleData(b"tt", (str(v).encode(), b"x" * 20)))


def _work(chunk: Callable[[int], None], first: int, last: int) -> Work:
    for i in range(first):
        chunk(i)
    with counting() as work:
        for i in range(first, last):
            chunk(i)
    return work


def _run(
    tmp_path: Path, chunk_of: Callable[[Receiver], Callable[[int], None]]
) -> tuple[Work, Work]:
    """The work of WINDOW chunks after EARLY chunks, and after LATE chunks."""
    out = []
    for start in (EARLY, LATE):
        feed = Receiver(tmp_path / str(start))
        feed(m.StreamStart(TOP, True), SENT, m.Truncate(TOP, 0, (REL.relation_id,)), m.StreamStop())
        try:
            out.append(_work(chunk_of(feed), start, start + WINDOW))
        finally:
            feed.close()
    return out[0], out[1]


def _values(txn: CommittedTxn) -> list[int]:
    out = []
    for seg in txn.segments:
        for payload, in_stream in read_records(seg):
            if payload[0] == m.TAG_INSERT:
                off = 9 if in_stream else 5  # tag [xid] relid 'N' ncols, then kind, length
                n = int.from_bytes(payload[off + 4 : off + 8], "big")
                out.append(int(payload[off + 8 : off + 8 + n]))
    return out


def test_a_reload_costs_the_same_per_chunk_late_as_early(tmp_path: Path) -> None:
    def chunk_of(feed: Receiver) -> Callable[[int], None]:
        def chunk(i: int) -> None:  # what pgoutput sends after the TRUNCATE
            feed(m.StreamStart(TOP, False), SENT, insert(TOP, i), m.StreamStop())

        return chunk

    early, late = _run(tmp_path, chunk_of)
    assert late.opcodes <= early.opcodes * 1.1, (early, late)
    assert late.read <= early.read * 2 + 4096, (early, late)


def test_subtransaction_aborts_cost_the_same_late_as_early(tmp_path: Path) -> None:
    # Every chunk starts a subtransaction whose changes enclose the resent RELATION;
    # every other one is aborted, the others are released and stay known.
    def chunk_of(feed: Receiver) -> Callable[[int], None]:
        def chunk(i: int) -> None:
            sub = 1000 + i
            feed(m.StreamStart(TOP, False), insert(sub, i), SENT, insert(sub, i), m.StreamStop())
            if i % 2:
                feed(m.StreamAbort(TOP, sub, feed.lsn, 0))

        return chunk

    early, late = _run(tmp_path, chunk_of)
    assert late.opcodes <= early.opcodes * 1.1, (early, late)
    assert late.read <= early.read * 2 + 4096, (early, late)


def test_what_a_reload_with_aborts_leaves_is_exact(tmp_path: Path) -> None:
    feed = Receiver(tmp_path)
    try:
        feed(m.StreamStart(TOP, True), SENT, m.Truncate(TOP, 0, (REL.relation_id,)), m.StreamStop())
        for i in range(300):
            sub = 1000 + i
            feed(m.StreamStart(TOP, False), SENT, insert(TOP, i), insert(sub, -i), m.StreamStop())
            if i % 3 == 0:
                feed(m.StreamAbort(TOP, sub, feed.lsn, 0))
        feed(m.StreamCommit(TOP, 0, 9000, 9010, 0))
        ((txn, _),) = feed.asm.take_ready(1 << 30, 10)
    finally:
        feed.close()
    kept = [v for i in range(300) for v in ((i,) if i % 3 == 0 else (i, -i))]
    assert _values(txn) == kept
    assert txn.has_truncate
    # The resent descriptions were the same one: it is spooled and listed once.
    assert txn.relation_messages == (REL,)
    tags = [p[0] for s in txn.segments for p, _ in read_records(s)]
    assert tags.count(m.TAG_RELATION) == 1
