"""Capture files: real pgoutput messages stored with the facts of the workload that
made them (written by :mod:`tests.pgoutput.capture`).

CAPTURE FILE FORMAT (``*.bin``; all integers big-endian)

::

    magic            8 bytes   b"PGOUTCAP"
    format version   uint16    1
    header length    uint32    n
    header           n bytes   UTF-8 JSON object; at least "proto_version" (int) and
                               "streaming" ("off" | "on" | "parallel"), also
                               "two_phase", "messages", "binary", "server_version",
                               "description", and workload facts for the tests
    then, until end of file, one record per message:
    lsn              uint64    the ``lsn`` column of the SQL interface
    xid              uint32    the ``xid`` column of the SQL interface
    payload length   uint32    m
    payload          m bytes   one pgoutput message, starting with its tag byte
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"PGOUTCAP"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct(">8sHI")
_RECORD = struct.Struct(">QII")


@dataclass(frozen=True, slots=True)
class Captured:
    """One pgoutput message as the SQL interface returned it."""

    lsn: int
    xid: int
    payload: bytes

    @property
    def tag(self) -> str:
        return chr(self.payload[0])


def write_capture(path: Path, header: dict[str, Any], records: Iterable[Captured]) -> int:
    """Write a capture file (format in the module docstring); returns the record count."""
    with open(path, "wb") as f:
        writer = CaptureWriter(f, header)
        for rec in records:
            writer.write(rec)
        return writer.count


class CaptureWriter:
    """Streams records into an open binary file, after writing the preamble."""

    def __init__(self, f: BinaryIO, header: dict[str, Any]) -> None:
        if "proto_version" not in header or "streaming" not in header:
            raise ValueError("a capture header needs 'proto_version' and 'streaming'")
        blob = json.dumps(header, sort_keys=True).encode()
        f.write(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(blob)))
        f.write(blob)
        self._f = f
        self.count = 0
        self.payload_bytes = 0

    def write(self, rec: Captured) -> None:
        self._f.write(_RECORD.pack(rec.lsn, rec.xid, len(rec.payload)))
        self._f.write(rec.payload)
        self.count += 1
        self.payload_bytes += len(rec.payload)


@dataclass(frozen=True, slots=True)
class CaptureFile:
    header: dict[str, Any]
    records: list[Captured] = field(default_factory=list)

    @property
    def payloads(self) -> list[bytes]:
        return [r.payload for r in self.records]


def read_capture(path: Path) -> CaptureFile:
    """Read a capture file written by :func:`write_capture`; strict about its framing."""
    data = Path(path).read_bytes()
    if len(data) < _PREAMBLE.size:
        raise ValueError(f"{path}: too short for a capture file")
    magic, version, hlen = _PREAMBLE.unpack_from(data, 0)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise ValueError(f"{path}: not a version {FORMAT_VERSION} capture file")
    pos = _PREAMBLE.size
    if pos + hlen > len(data):
        raise ValueError(f"{path}: truncated header")
    header = json.loads(data[pos : pos + hlen])
    pos += hlen
    records: list[Captured] = []
    view = memoryview(data)
    while pos < len(data):
        if pos + _RECORD.size > len(data):
            raise ValueError(f"{path}: truncated record header at offset {pos}")
        lsn, xid, n = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size
        if n == 0 or pos + n > len(data):
            raise ValueError(f"{path}: bad payload length {n} at offset {pos}")
        records.append(Captured(lsn, xid, bytes(view[pos : pos + n])))
        pos += n
    return CaptureFile(header, records)


def tags(records: Sequence[Captured]) -> str:
    """The tag letters of ``records``, e.g. ``"BRIC"``, for quick looks and asserts."""
    return "".join(r.tag for r in records)
