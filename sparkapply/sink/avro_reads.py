"""Manifest lists and manifests read as pyiceberg reads them, with their Avro readers kept.

pyiceberg's ``AvroFile`` parses the header's schema and builds a reader tree for the
file's schema against the read schema every time it opens a file: 2-3 ms, most of
reading a manifest of a few entries. In a steady stream each batch reads about ten
such files (each table's new data and delete manifests, listed for the next batch;
maintenance's listings and expiry more), all written with one of a few schemas: one
per table's partition type and format version, per kind of file. So the reader of a
(header schema, kind of file) pair is built once per process (:data:`_READERS`); the
file's own header still names it, so a file written by another engine with another
schema gets a reader of its own.

What comes back is what pyiceberg's ``ManifestFile.fetch_manifest_entry`` and
``read_manifest_list`` return: the same read schemas, types and enums, and the same
inheritance of sequence numbers from the manifest (``_inherit_from_manifest``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import Enum
from typing import Any

from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import AvroFile, AvroFileHeader
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import resolve_reader
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    PartitionFieldSummary,
    _inherit_from_manifest,
)
from pyiceberg.schema import Schema
from pyiceberg.typedef import StructProtocol

_SCHEMA_KEY = "avro.schema"  # the header entry that holds the file's schema (Avro spec)


class _Kind:
    """One kind of file: the read schema, types and enums pyiceberg reads it with."""

    def __init__(
        self,
        read_schema: Schema,
        read_types: dict[int, Callable[..., StructProtocol]],
        read_enums: dict[int, Callable[..., Enum]],
    ) -> None:
        self.read_schema = read_schema
        self.read_types = read_types
        self.read_enums = read_enums


_ENTRIES = _Kind(
    MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION],
    {-1: ManifestEntry, 2: DataFile},
    {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
)
_LIST = _Kind(
    MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION],
    {-1: ManifestFile, 508: PartitionFieldSummary},
    {517: ManifestContent},
)


class _Readers:
    """Reader trees by (kind of file, header schema text), built once each."""

    def __init__(self) -> None:
        self._built: dict[tuple[int, str], tuple[Schema, Reader]] = {}
        self._lock = threading.Lock()

    def of(self, kind: _Kind, header: AvroFileHeader) -> tuple[Schema, Reader]:
        key = (id(kind), header.meta.get(_SCHEMA_KEY, ""))
        with self._lock:
            found = self._built.get(key)
        if found is None:
            schema = header.get_schema()
            reader = resolve_reader(schema, kind.read_schema, kind.read_types, kind.read_enums)
            found = (schema, reader)
            with self._lock:
                self._built[key] = found
        return found


_READERS = _Readers()


class _KeptReaderFile(AvroFile[Any]):
    """pyiceberg's ``AvroFile`` whose reader tree comes from :data:`_READERS`."""

    __slots__ = ("kind",)

    def __init__(self, kind: _Kind, input_file: Any) -> None:
        super().__init__(input_file, kind.read_schema, kind.read_types, kind.read_enums)
        self.kind = kind

    def __enter__(self) -> _KeptReaderFile:
        with self.input_file.open() as f:
            self.decoder = new_decoder(f.read())
        self.header = self._read_header()
        self.schema, self.reader = _READERS.of(self.kind, self.header)
        return self


def manifest_entries(
    manifest: ManifestFile, io: FileIO, *, discard_deleted: bool
) -> list[ManifestEntry]:
    """``manifest.fetch_manifest_entry(io, discard_deleted)``, its reader kept."""
    with _KeptReaderFile(_ENTRIES, io.new_input(manifest.manifest_path)) as reader:
        return [
            _inherit_from_manifest(entry, manifest)
            for entry in reader
            if not discard_deleted or entry.status != ManifestEntryStatus.DELETED
        ]


def manifest_list(path: str, io: FileIO) -> tuple[ManifestFile, ...]:
    """``read_manifest_list(io.new_input(path))``, its reader kept."""
    with _KeptReaderFile(_LIST, io.new_input(path)) as reader:
        return tuple(reader)
