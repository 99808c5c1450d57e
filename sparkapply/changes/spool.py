"""On-disk spool of raw pgoutput change messages.

A record is ``u32 length, u8 flags, payload``; flag bit 0 says the payload was sent
inside a stream block (it carries the xid prefix). Executors read records back by
``(path, start, end)`` segment; nothing in a record depends on driver memory.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sparkapply.errors import StateError

_HEADER = struct.Struct("!IB")
FLAG_IN_STREAM = 1


@dataclass(frozen=True, slots=True)
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

    def append(self, payload: bytes | memoryview, in_stream: bool) -> int:
        """Write one record; returns the offset where it starts."""
        start = self.offset
        self._f.write(_HEADER.pack(len(payload), FLAG_IN_STREAM if in_stream else 0))
        self._f.write(payload)
        self.offset += _HEADER.size + len(payload)
        return start

    def truncate(self, offset: int) -> None:
        self._f.flush()
        self._f.truncate(offset)
        self._f.seek(offset)
        self.offset = offset

    def flush(self, durable: bool = False) -> None:
        self._f.flush()
        if durable:
            os.fsync(self._f.fileno())

    def segment(self, start: int, end: int | None = None) -> SpoolSegment:
        return SpoolSegment(str(self.path), start, self.offset if end is None else end)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def read_records(segment: SpoolSegment) -> Iterator[tuple[bytes, bool]]:
    """Yield (payload, in_stream) for every record of the segment."""
    try:
        with open(segment.path, "rb") as f:
            f.seek(segment.start)
            data = f.read(segment.end - segment.start)
    except OSError as exc:
        raise StateError(
            f"spool segment {segment.path}[{segment.start}:{segment.end}] is unreadable: {exc}",
            hint="in cluster mode work_dir must be on storage every executor can read",
        ) from exc
    pos = 0
    n = len(data)
    mv = memoryview(data)
    while pos < n:
        if pos + _HEADER.size > n:
            raise StateError(f"truncated spool record in {segment.path} at {segment.start + pos}")
        length, flags = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        if pos + length > n:
            raise StateError(f"truncated spool record in {segment.path} at {segment.start + pos}")
        yield bytes(mv[pos : pos + length]), bool(flags & FLAG_IN_STREAM)
        pos += length
