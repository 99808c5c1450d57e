"""Manifests and manifest lists written as pyiceberg writes them, with each file schema's
Avro writer and header schema built once.

pyiceberg's ``AvroOutputFile`` builds a writer tree for the record schema against the
file schema, and converts the file schema to Avro JSON for the header, every time it
writes a file; a manifest writer first builds the manifest-entry schema for the
table's partition type. That was two fifths of staging a table's snapshot in a steady
stream, where every batch writes a data manifest, a delete manifest and a manifest
list per table, all with one of a few schemas. So those pieces are built once per
(kind of file, format version, partition type) (:data:`_SHAPES`); the files written are
byte for byte what pyiceberg writes, but for the random sync marker each file has.
(The read side is ``avro_reads.py``.)
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.avro.file import META_SCHEMA, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.resolver import construct_writer, resolve_writer
from pyiceberg.avro.writer import Writer
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    ManifestContent,
    ManifestEntry,
    ManifestListWriter,
    ManifestListWriterV2,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

_SCHEMA_KEY = "avro.schema"  # the header entry that holds the file's schema (Avro spec)
_MAGIC = b"Obj\x01"
_SYNC_SIZE = 16


@dataclass(frozen=True, slots=True)
class _Shape:
    """What pyiceberg builds anew for each file: the file schema, the writer of
    records into it, and the schema's Avro JSON for the header."""

    file_schema: Schema
    writer: Writer
    schema_json: str


class _Shapes:
    def __init__(self) -> None:
        self._built: dict[Hashable, _Shape] = {}
        self._lock = threading.Lock()
        self._header_writer = construct_writer(META_SCHEMA)

    def of(
        self, key: Hashable, schemas: Callable[[], tuple[Schema, Schema]], schema_name: str
    ) -> _Shape:
        """The shape of ``key``; ``schemas()`` gives (file schema, record schema) the
        first time."""
        with self._lock:
            found = self._built.get(key)
        if found is None:
            file_schema, record_schema = schemas()
            found = _Shape(
                file_schema,
                resolve_writer(record_schema=record_schema, file_schema=file_schema),
                json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name)),
            )
            with self._lock:
                self._built[key] = found
        return found

    def write_header(self, file: _KeptWriterFile) -> None:
        """pyiceberg's ``AvroOutputFile._write_header``, with the schema JSON kept."""
        codec = file.metadata.get(AVRO_CODEC_KEY, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
        codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec) or codec
        meta = {**file.metadata, _SCHEMA_KEY: file.schema_json, AVRO_CODEC_KEY: codec}
        self._header_writer.write(file.encoder, AvroFileHeader(_MAGIC, meta, file.sync_bytes))


_SHAPES = _Shapes()


class _KeptWriterFile(AvroOutputFile[Any]):
    """pyiceberg's ``AvroOutputFile`` with its writer and header schema from a
    :class:`_Shape` (its own ``__init__`` would build them)."""

    def __init__(
        self, output_file: OutputFile, shape: _Shape, schema_name: str, metadata: dict[str, str]
    ) -> None:
        self.output_file = output_file
        self.file_schema = shape.file_schema
        self.schema_name = schema_name
        self.sync_bytes = os.urandom(_SYNC_SIZE)
        self.writer = shape.writer
        self.metadata = metadata
        self.schema_json = shape.schema_json

    def _write_header(self) -> None:
        _SHAPES.write_header(self)


class DataManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, its Avro writer kept per partition type."""

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        key = ("manifest_entry", self.version, self._spec.partition_type(self._schema))
        shape = _SHAPES.of(
            key,
            lambda: (
                self._with_partition(self.version),
                self._with_partition(DEFAULT_READ_VERSION),
            ),
            "manifest_entry",
        )
        return _KeptWriterFile(self._output_file, shape, "manifest_entry", self._meta)


class DeleteManifestWriter(DataManifestWriter):
    """The same, declaring ``deletes`` content."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class ManifestListWriterV2Kept(ManifestListWriterV2):
    """pyiceberg's v2 manifest list writer, its Avro writer kept."""

    def __enter__(self) -> ManifestListWriter:
        shape = _SHAPES.of(
            ("manifest_file", self._format_version),
            lambda: (
                MANIFEST_LIST_FILE_SCHEMAS[self._format_version],
                MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION],
            ),
            "manifest_file",
        )
        self._writer = _KeptWriterFile(self._output_file, shape, "manifest_file", self._meta)
        self._writer.__enter__()
        return self
