"""Test-only: give a table a position-delete file, as Spark or Trino do in merge-on-read
mode. pyiceberg cannot write delete files, so this assembles the snapshot by hand."""

# pyiceberg's pydantic models accept field names at runtime; without the pydantic mypy
# plugin mypy only knows their aliases ("snapshot-id").
# mypy: disable-error-code="call-arg"

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    write_manifest_list,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.typedef import Record

from sparkapply.datafiles import data_directory
from sparkapply.sink.avro_writes import DeleteManifestWriter


def delete_row(table: Table, data_file: str, position: int) -> None:
    """Commit a snapshot that deletes row ``position`` of ``data_file`` by a delete file."""
    metadata = table.metadata
    parent = table.current_snapshot()
    assert parent is not None
    snapshot_id = metadata.new_snapshot_id()

    path = f"{data_directory(table)}/{uuid.uuid4()}-deletes.parquet"
    pq.write_table(
        pa.table({"file_path": [data_file], "pos": pa.array([position], pa.int64())}), path
    )
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=os.path.getsize(urlsplit(path).path),
    )
    delete_file.spec_id = metadata.default_spec_id

    manifest_path = f"{table.location()}/metadata/{uuid.uuid4()}-m0.avro"
    writer = DeleteManifestWriter(
        metadata.spec(),
        metadata.schema(),
        table.io.new_output(manifest_path),
        snapshot_id,
        "deflate",
    )
    with writer:
        writer.add(
            ManifestEntry.from_args(
                status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=delete_file
            )
        )
    sequence_number = metadata.next_sequence_number()
    list_path = f"{table.location()}/metadata/snap-{snapshot_id}-0-{uuid.uuid4()}.avro"
    with write_manifest_list(
        format_version=2,
        output_file=table.io.new_output(list_path),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=sequence_number,
        avro_compression="deflate",
    ) as manifest_list:
        manifest_list.add_manifests([*parent.manifests(table.io), writer.to_manifest_file()])
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=sequence_number,
        manifest_list=list_path,
        summary=Summary(operation=Operation.DELETE),
        schema_id=metadata.current_schema_id,
    )
    table.catalog.commit_table(
        table,
        (AssertRefSnapshotId(snapshot_id=parent.snapshot_id, ref="main"),),
        (
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(
                ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id
            ),
        ),
    )
    table.refresh()
