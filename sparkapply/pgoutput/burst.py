"""A burst's run of ordinary transactions received whole, read column-wise.

Under a load of small transactions (pgbench, one-row updates) the stream is BEGIN, a
few changes, COMMIT, over and over, and the receiving thread's cost per message is
what bounds how fast a backlog of them is received. Read one message at a time that
was 12 µs a one-row transaction (20,000 of them: a quarter of a second, longer than
the walsender took to send them). So the run is read the way the executors read
tuples: each frame's tag byte, gathered into one string for the whole burst
(:func:`frame_tags`), is matched as text (BEGIN, changes, COMMIT); then each field is
gathered for all the run's messages of one kind at once (sizes, commit flags,
relation ids, xids, the commit's LSNs and time), in C loops, and checked as arrays.

What :func:`whole_run` takes is exactly what the message-at-a-time path would take
as an ordinary transaction whole in the burst: a BEGIN of its size, changes (INSERT,
UPDATE, DELETE, each at least its fixed head) of relations already described, a
COMMIT of its size with no flags. It stops at the first transaction that is anything
else (a RELATION, TYPE, TRUNCATE, ORIGIN or MESSAGE inside, a relation not described
yet, a message of a wrong size, a transaction not whole in the burst), which the
caller's general path then reads and, if it is malformed, reports. Layouts from
:mod:`sparkapply.pgoutput.peek`. No I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from sparkapply.pgoutput.messages import TAG_BEGIN, TAG_COMMIT
from sparkapply.pgoutput.peek import BEGIN_SIZE, BEGIN_XID_AT, CHANGE_HEAD, COMMIT_SIZE

# Tag bytes: BEGIN, any INSERT/UPDATE/DELETE, COMMIT; as many as follow each other.
_WHOLE = re.compile(rb"(?:B[IUD]*C)*")
_CHANGES = re.compile(rb"[IUD]*")
_COMMIT_FIELDS = np.dtype([("flags", "u1"), ("lsn", ">u8"), ("end", ">u8"), ("time", ">i8")])
NO_MESSAGE = 0  # the tag of a frame that carries no message (it matches nothing)


def frame_tags(frames: Sequence[memoryview], header: int) -> bytes:
    """The tag byte of each frame's message (``header`` bytes in), one byte a frame."""
    try:
        return bytes(map(itemgetter(header), frames))
    except IndexError:  # a frame with no message after its header: the decoder says so
        return bytes(f[header] if len(f) > header else NO_MESSAGE for f in frames)


@dataclass(frozen=True, slots=True)
class WholeRun:
    """Transactions whole in a burst, back to back, frames ``start`` to ``end``.

    Per transaction: its xid, commit LSN, end LSN and commit time, and where its
    changes are among the run's changes (``bounds[t]`` to ``bounds[t + 1]``). Per
    change: its relation id and its tag; ``changes`` is the change frames, whole,
    joined, of ``change_sizes`` (spooled by ``SpoolWriter.extend_frames``)."""

    start: int
    end: int
    xids: list[int]
    commit_lsns: list[int]
    end_lsns: list[int]
    commit_times: list[int]
    bounds: list[int]
    relation_ids: list[int]
    change_tags: bytes
    changes: bytearray
    change_sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.xids)


def whole_run(
    frames: Sequence[memoryview],
    tags: bytes,
    start: int,
    header: int,
    described: Collection[int],
) -> WholeRun | None:
    """The ordinary transactions received whole from ``frames[start]`` on (``tags``
    from :func:`frame_tags`), whose changes are all to ``described`` relations; None
    when the first is not one (see the module doc)."""
    found = _WHOLE.match(tags, start)  # matches at least the empty string
    end = found.end() if found is not None else start
    if end == start:
        return None
    kinds = np.frombuffer(tags, np.uint8, end - start, start)
    sizes = np.fromiter(map(len, frames[start:end]), np.int64, end - start)
    begins = np.flatnonzero(kinds == TAG_BEGIN)
    commits = np.flatnonzero(kinds == TAG_COMMIT)
    changes = np.flatnonzero((kinds != TAG_BEGIN) & (kinds != TAG_COMMIT))
    # Sizes first: only a message of its size has the fields read below.
    bad = np.concatenate(
        (
            begins[sizes[begins] != header + BEGIN_SIZE],
            commits[sizes[commits] != header + COMMIT_SIZE],
            changes[sizes[changes] < header + CHANGE_HEAD],
        )
    )
    n = _whole_before(begins, bad)
    begins, commits = begins[:n], commits[:n]
    changes = changes[: _changes_before(changes, commits)]
    if n == 0:
        return None
    sub = frames[start:end]
    head, tail = _pick(sub, begins), _pick(sub, commits)
    fields = np.frombuffer(b"".join(tail), _commit_frame(header))
    joined = bytearray().join(_pick(sub, changes))
    change_sizes = sizes[changes]
    relids = u32_at(joined, change_sizes, header + 1)
    known = np.fromiter(described, np.int64, len(described))
    # The change's own transaction goes: its BEGIN is the last one before it.
    unknown = changes[~np.isin(relids, known)]
    flagged = commits[fields["flags"] != 0]
    m = _whole_before(begins, np.concatenate((unknown, flagged)))
    if m < n:
        n = m
        begins, commits = begins[:n], commits[:n]
        k = _changes_before(changes, commits)
        changes, relids, fields = changes[:k], relids[:k], fields[:n]
        change_sizes = change_sizes[:k]
        del joined[int(change_sizes.sum()) :]
        head = head[:n]
        if n == 0:
            return None
    xids = np.frombuffer(b"".join(head), _begin_frame(header))["xid"]
    counts = commits - begins - 1
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return WholeRun(
        start=start,
        end=start + int(commits[-1]) + 1,
        xids=xids.tolist(),
        commit_lsns=fields["lsn"].tolist(),
        end_lsns=fields["end"].tolist(),
        commit_times=fields["time"].tolist(),
        bounds=bounds.tolist(),
        relation_ids=relids.tolist(),
        change_tags=bytes(kinds[changes]),
        changes=joined,
        change_sizes=change_sizes,
    )


def _whole_before(begins: np.ndarray, bad: np.ndarray) -> int:
    """How many transactions end before the first of the ``bad`` frames: the one
    holding it, and those after, are left out."""
    if not len(bad):
        return len(begins)
    return int(np.searchsorted(begins, bad.min(), "right")) - 1


def _changes_before(changes: np.ndarray, commits: np.ndarray) -> int:
    """How many of ``changes`` belong to the transactions ending at ``commits``."""
    return int(np.searchsorted(changes, commits[-1], "left")) if len(commits) else 0


# The fields are read from whole frames joined, through a dtype of the frame (BEGIN
# and COMMIT have one size) or at offsets into the joined frames (changes): a slice of
# each frame cost 0.27 µs, 40% of the run's reading.


def _pick(frames: Sequence[memoryview], at: np.ndarray) -> tuple[memoryview, ...]:
    """``frames`` at the positions ``at``."""
    if len(at) > 1:
        picked: tuple[memoryview, ...] = itemgetter(*at.tolist())(frames)
        return picked
    return tuple(frames[k] for k in at.tolist())


@functools.cache
def _commit_frame(header: int) -> np.dtype[np.void]:
    """A COMMIT frame: its XLogData head and tag, then the fields."""
    return np.dtype([("head", f"V{header + 1}"), *_COMMIT_FIELDS.descr])


@functools.cache
def _begin_frame(header: int) -> np.dtype[np.void]:
    """A BEGIN frame: its XLogData head and the message up to the xid, then the xid."""
    return np.dtype([("head", f"V{header + BEGIN_XID_AT}"), ("xid", ">u4")])


def changes_end(tags: bytes, start: int) -> int:
    """Where the run of change messages (INSERT, UPDATE, DELETE) from ``start`` ends,
    by the tags of :func:`frame_tags`."""
    found = _CHANGES.match(tags, start)  # matches at least the empty string
    return found.end() if found is not None else start


def u32_at(joined: bytes | bytearray, sizes: np.ndarray, at: int) -> np.ndarray:
    """The big-endian unsigned 32-bit integer ``at`` bytes into each of the frames
    of ``sizes`` joined in ``joined``."""
    starts = np.cumsum(sizes) - sizes + at
    data = np.frombuffer(joined, np.uint8)
    found: np.ndarray = data[starts[:, None] + np.arange(4)].view(">u4").ravel()
    return found
