"""On-disk spool of raw pgoutput change messages.

A record is ``u32 length, u8 flags, payload``; flag bit 0 says the payload was sent
inside a stream block (it carries the xid prefix). Flag bit 1 says the record is a
whole XLogData frame as received, its head overwritten by the record's own: the
payload's first :data:`FRAME_PAD` bytes are what is left of that head, and the
message follows. The receiving thread spools a run of frames that way in one write
of the frames joined (:meth:`SpoolWriter.extend_frames`), where it cut each message
out of its frame and wrote a header before it: 20,000 pgbench-shaped transactions
(80,000 changes) were fed in 58-59 ms instead of 72-74, for 20 bytes a record more.
Executors read records back by ``(path, start, end)`` segment; nothing in a record
depends on driver memory.

Beside each spool file, ``<file>.idx`` lists every record's start offset (little-endian
int64), appended when the writer flushes. Finding records by walking their length
prefixes is a Python loop per record; with the index an executor finds a segment's
records with two binary searches and reads every length with one numpy gather. The
index is only a hint: a reader checks that it tiles the segment exactly and walks the
records when it does not (a file copied without its index, a crash between writes).

:class:`SpoolDirectory` owns the files: one shared file that ordinary transactions
append to (rotated once it passes a size), one file per streamed transaction, and a
reference count per file, so a file is deleted when the last transaction in it is
durable and released.
"""

from __future__ import annotations

import bisect
import itertools
import os
import shutil
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sparkapply.errors import StateError
from sparkapply.frozen import hot_frozen
from sparkapply.pgoutput.frames import XLOG_DATA_HEADER
from sparkapply.state.space import full_disk_error

_HEADER = struct.Struct("!IB")
FLAG_IN_STREAM = 1
FLAG_FRAMED = 2
RECORD_OVERHEAD = _HEADER.size  # bytes a record adds to its payload
# What is left of a framed record's XLogData head after the record's header.
FRAME_PAD = XLOG_DATA_HEADER.size - RECORD_OVERHEAD
_INDEX_STEP = 64  # index entries a truncation reads back first (then twice as many)


@hot_frozen  # one per transaction on the receiving thread: see sparkapply/frozen.py
class SpoolSegment:
    """A byte range of one spool file holding whole records."""

    path: str
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class SpoolWriter:
    """Appends records to one file; can truncate back to an earlier offset."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: BinaryIO = open(path, "ab+")  # noqa: SIM115 - lives as long as the writer
        self._f.seek(0, os.SEEK_END)
        self.offset = self._f.tell()
        self._flushed = self.offset  # what flush() last handed to the file system
        self._idx: BinaryIO = open(index_path(str(path)), "ab+")  # noqa: SIM115 - as _f
        self._pending = array("q")  # record starts not yet in the index file

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._f.write(data)
        except OSError as exc:
            raise full_disk_error(exc, self.path, len(data)) or exc from exc

    def append(self, payload: bytes | memoryview, in_stream: bool) -> int:
        """Write one record; returns the offset where it starts."""
        start = self.offset
        self._write(_HEADER.pack(len(payload), FLAG_IN_STREAM if in_stream else 0))
        self._write(payload)
        self.offset += _HEADER.size + len(payload)
        self._pending.append(start)
        return start

    def extend(self, payloads: list[memoryview], in_stream: bool) -> list[int]:
        """Write one record per payload, in one write: the receive loop hands over a
        burst's run of changes at once. Returns where each record starts, then the
        offset after the last (the loops are C's: this runs per burst, per change)."""
        sizes = list(map(len, payloads))
        parts: list[bytes | memoryview] = [b""] * (2 * len(payloads))
        parts[0::2] = map(_HEADER.pack, sizes, repeat(FLAG_IN_STREAM if in_stream else 0))
        parts[1::2] = payloads
        offsets = list(accumulate(map(add, sizes, repeat(RECORD_OVERHEAD)), initial=self.offset))
        self._write(b"".join(parts))
        self._pending.extend(offsets[:-1])
        self.offset = offsets[-1]
        return offsets

    def extend_frames(self, joined: bytearray, sizes: np.ndarray, in_stream: bool) -> list[int]:
        """Write ``joined``, XLogData frames of ``sizes`` back to back, as one record
        each (see the module doc): their heads are overwritten in place, so the frames
        are written as they are, in one write. Returns what :meth:`extend` returns."""
        if not len(sizes):
            return [self.offset]
        data = np.frombuffer(joined, np.uint8)
        at = np.cumsum(sizes) - sizes
        lengths = (sizes - RECORD_OVERHEAD).astype(">u4")
        data[at[:, None] + np.arange(4)] = lengths.view(np.uint8).reshape(-1, 4)
        data[at + 4] = FLAG_FRAMED | (FLAG_IN_STREAM if in_stream else 0)
        del data  # a bytearray with a view on it cannot be resized by its owner
        starts = at + self.offset
        self._write(joined)
        self._pending.frombytes(starts.astype("<i8").tobytes())
        self.offset += len(joined)
        offsets: list[int] = starts.tolist()
        offsets.append(self.offset)
        return offsets

    def truncate(self, offset: int) -> None:
        self._f.flush()
        self._f.truncate(offset)
        self._f.seek(offset)
        self.offset = offset
        self._flushed = offset
        keep = bisect.bisect_left(self._pending, offset)
        del self._pending[keep:]
        self._cut_index(offset)

    def _cut_index(self, offset: int) -> None:
        """Drop the index entries of records from ``offset`` on. A transaction may
        abort a subtransaction at every chunk, so this reads the sorted entries back
        from the end only as far as the cut, not the whole index each time."""
        self._idx.flush()
        fd = self._idx.fileno()
        n = os.fstat(fd).st_size // 8
        keep, step = n, _INDEX_STEP
        while keep:
            lo = max(0, keep - step)
            block = np.frombuffer(os.pread(fd, (keep - lo) * 8, lo * 8), dtype="<i8")
            below = int(np.searchsorted(block, offset, "left"))
            keep = lo + below
            if below:
                break
            step *= 2
        if keep < n:
            self._idx.truncate(keep * 8)
            self._idx.seek(keep * 8)

    def _write_index(self) -> None:
        if self._pending:
            self._idx.write(np.asarray(self._pending, dtype="<i8").tobytes())
            del self._pending[:]

    def flush(self, durable: bool = False) -> None:
        try:
            self._f.flush()
            self._write_index()
            self._idx.flush()
            if durable:
                os.fsync(self._f.fileno())
        except OSError as exc:  # buffered bytes meet a full disk only here
            raise full_disk_error(exc, self.path, self.offset - self._flushed) or exc from exc
        self._flushed = self.offset

    def segment(self, start: int, end: int | None = None) -> SpoolSegment:
        return SpoolSegment(str(self.path), start, self.offset if end is None else end)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
        if not self._idx.closed:
            self._write_index()
            self._idx.close()


def index_path(spool_path: str) -> str:
    return spool_path + ".idx"


def remove_spool_file(path: str | Path) -> None:
    """Delete a spool file and its index."""
    Path(path).unlink(missing_ok=True)
    Path(index_path(str(path))).unlink(missing_ok=True)


SHARED_FILE_ROTATE_BYTES = 64 * 1024 * 1024


class SpoolDirectory:
    """The spool files of one replication session under ``root``.

    Streams and unapplied transactions are re-sent after a restart, so the spool is
    never trusted across one: the directory is emptied when this is created.
    """

    def __init__(self, root: Path, *, rotate_bytes: int = SHARED_FILE_ROTATE_BYTES) -> None:
        self.root = root
        self.rotate_bytes = rotate_bytes
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        self._shared: SpoolWriter | None = None
        self._refs: dict[str, int] = {}
        self._seq = itertools.count()

    def shared(self) -> SpoolWriter:
        """The file a new ordinary transaction appends to: the current shared file, or
        a fresh one once that has passed ``rotate_bytes`` (only call between
        transactions: one transaction's records stay in one file)."""
        if self._shared is None or self._shared.offset > self.rotate_bytes:
            old = self._shared
            if old is not None:
                old.close()
                if self._refs.get(str(old.path), 0) == 0:
                    remove_spool_file(old.path)
            self._shared = SpoolWriter(self.root / f"txns-{next(self._seq)}.spool")
        return self._shared

    def flush_shared(self) -> None:
        """Make what ordinary transactions appended readable by executors."""
        if self._shared is not None:
            self._shared.flush()

    def new_stream(self, xid: int) -> SpoolWriter:
        """An empty file of its own for the streamed transaction ``xid``."""
        writer = SpoolWriter(self.root / f"stream-{xid}-{next(self._seq)}.spool")
        writer.truncate(0)
        return writer

    @staticmethod
    def is_stream(writer: SpoolWriter) -> bool:
        return writer.path.name.startswith("stream-")

    @staticmethod
    def discard(writer: SpoolWriter) -> None:
        """Close and delete a stream's file (its transaction aborted)."""
        writer.close()
        remove_spool_file(writer.path)

    def hold(self, path: str, transactions: int = 1) -> None:
        """Committed transactions reference ``path``, each until its :meth:`release`."""
        self._refs[path] = self._refs.get(path, 0) + transactions

    def release(self, path: str, n: int = 1) -> None:
        """``n`` transactions that referenced ``path`` are durable; the file is deleted
        with its last reference, unless it is the shared file still being appended to
        (then it goes at rotation)."""
        refs = self._refs.get(path, 0) - n
        if refs > 0:
            self._refs[path] = refs
            return
        self._refs.pop(path, None)
        if self._shared is not None and str(self._shared.path) == path:
            return
        remove_spool_file(path)


READ_CHUNK = 8 * 1024 * 1024


def read_records(segment: SpoolSegment) -> Iterator[tuple[bytes, bool]]:
    """Yield (payload, in_stream) for every record of the segment.

    Reads in chunks of :data:`READ_CHUNK` bytes, so memory stays bounded whatever
    the size of the transaction.
    """
    for chunk in read_chunks(segment):
        data = chunk.data
        for start, length, in_stream in zip(
            chunk.starts, chunk.lengths, chunk.in_stream, strict=True
        ):
            yield data[start : start + length], in_stream


@dataclass(frozen=True, slots=True)
class RecordChunk:
    """A run of whole records held in one buffer, with their index.

    ``starts[i]`` is where record i's payload begins in ``data``, ``lengths[i]`` its
    length, ``in_stream[i]`` its flag. For column-wise decoding (numpy gathers).
    """

    data: bytes
    starts: list[int] | np.ndarray
    lengths: list[int] | np.ndarray
    in_stream: list[bool] | np.ndarray


def read_chunks(segment: SpoolSegment, chunk_size: int | None = None) -> Iterator[RecordChunk]:
    """The segment's records, a chunk of about ``chunk_size`` bytes at a time."""
    size = chunk_size or READ_CHUNK
    starts = _indexed_starts(segment)
    if starts is not None:
        chunks = _indexed_chunks(segment, starts, size)
        first = next(chunks, None)
        if first is not None:
            yield first
            yield from chunks
            return
    yield from _walked_chunks(segment, size)


def _indexed_starts(segment: SpoolSegment) -> np.ndarray | None:
    """The segment's record starts from the index, or None if it has no usable one."""
    if segment.end <= segment.start:
        return None
    try:
        # Mapped, not read: a binary search touches a few pages of a big index.
        every = np.memmap(index_path(segment.path), dtype="<i8", mode="r")
    except (OSError, ValueError):  # missing, or empty
        return None
    lo = int(np.searchsorted(every, segment.start, "left"))
    hi = int(np.searchsorted(every, segment.end, "left"))
    starts = np.array(every[lo:hi])
    del every
    if len(starts) == 0 or int(starts[0]) != segment.start:
        return None
    if not bool(np.all(np.diff(starts) > 0)):
        return None
    return starts


def _indexed_chunks(segment: SpoolSegment, starts: np.ndarray, size: int) -> Iterator[RecordChunk]:
    """Chunks cut at record starts; each checked to tile its bytes exactly (the first
    failing check yields nothing, so the caller walks the records instead)."""
    hsize = _HEADER.size
    with open(segment.path, "rb") as f:
        a = 0
        n = len(starts)
        while a < n:
            b = max(a + 1, int(np.searchsorted(starts, int(starts[a]) + size, "left")))
            begin = int(starts[a])
            stop = int(starts[b]) if b < n else segment.end
            f.seek(begin)
            buf = f.read(stop - begin)
            rel = starts[a:b] - begin
            raw = np.frombuffer(buf, np.uint8)
            sane = bool(np.all(np.diff(rel) >= hsize)) and int(rel[-1]) + hsize <= len(buf)
            if len(buf) != stop - begin or not sane:
                if a == 0:
                    return
                raise StateError(f"spool {segment.path} ends before the segment end {segment.end}")
            lengths = raw[rel[:, None] + np.arange(4)].view(">u4").reshape(-1).astype(np.int64)
            ends = rel + hsize + lengths
            if not (np.array_equal(ends[:-1], rel[1:]) and int(ends[-1]) == len(buf)):
                if a == 0:
                    return
                raise StateError(
                    f"spool {segment.path}: its index disagrees with the records at {begin}"
                )
            flags = raw[rel + 4]
            pad = ((flags & FLAG_FRAMED) != 0) * FRAME_PAD
            if bool(np.any(pad > lengths)):
                raise StateError(f"spool {segment.path}: a framed record too short at {begin}")
            in_stream = (flags & FLAG_IN_STREAM).astype(bool)
            yield RecordChunk(buf, rel + hsize + pad, lengths - pad, in_stream)
            a = b


def _walked_chunks(segment: SpoolSegment, size: int) -> Iterator[RecordChunk]:
    try:
        f = open(segment.path, "rb")  # noqa: SIM115 - closed in the finally below
    except OSError as exc:
        raise StateError(
            f"spool segment {segment.path}[{segment.start}:{segment.end}] is unreadable: {exc}",
            hint="in cluster mode work_dir must be on storage every executor can read",
        ) from exc
    unpack = _HEADER.unpack_from
    hsize = _HEADER.size
    try:
        f.seek(segment.start)
        remaining = segment.end - segment.start
        pending = b""
        offset = segment.start
        while remaining > 0:
            chunk = f.read(min(size, remaining))
            if not chunk:
                raise StateError(f"spool {segment.path} ends before the segment end {segment.end}")
            remaining -= len(chunk)
            buf = pending + chunk if pending else chunk
            starts: list[int] = []
            lengths: list[int] = []
            flags: list[bool] = []
            pos, n = 0, len(buf)
            while pos + hsize <= n:
                length, flag = unpack(buf, pos)
                end = pos + hsize + length
                if end > n:
                    break
                pad = FRAME_PAD if flag & FLAG_FRAMED else 0
                if pad > length:
                    raise StateError(
                        f"spool {segment.path}: a framed record too short at {offset + pos}"
                    )
                starts.append(pos + hsize + pad)
                lengths.append(length - pad)
                flags.append(bool(flag & FLAG_IN_STREAM))
                pos = end
            if starts:
                yield RecordChunk(buf, starts, lengths, flags)
            pending = buf[pos:]
            offset += pos
        if pending:
            raise StateError(f"truncated spool record in {segment.path} at {offset}")
    finally:
        f.close()
