"""Manifests and manifest lists written with kept Avro writers: byte for byte what
pyiceberg's writers write (but for each file's random sync marker), and read back the
same by pyiceberg."""

from __future__ import annotations

from pathlib import Path

from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    ManifestEntry,
    ManifestFile,
    ManifestWriterV2,
    read_manifest_list,
    write_manifest_list,
)
from pyiceberg.table import Table

from sparkapply.lsn import Lsn
from sparkapply.sink import commit_files
from sparkapply.sink.avro_writes import DataManifestWriter, ManifestListWriterV2Kept

from .executor_files import write_orders


def _unsynced(path: Path) -> bytes:
    """The file's bytes with its sync marker (its last 16 bytes, after every block)
    blanked."""
    data = path.read_bytes()
    return data.replace(data[-16:], b"\0" * 16)


def test_files_are_pyiceberg_files(orders: Table, tmp_path: Path) -> None:
    for lsn in (1, 2):
        commit_files(orders, added=[write_orders(orders, [lsn, lsn + 10])], lsn=Lsn(lsn))
    snapshot = orders.current_snapshot()
    assert snapshot is not None
    manifests = snapshot.manifests(orders.io)
    entries: list[ManifestEntry] = [
        e for m in manifests for e in m.fetch_manifest_entry(orders.io, discard_deleted=False)
    ]
    io = PyArrowFileIO()
    spec, schema, snapshot_id = orders.spec(), orders.schema(), 4242

    written: dict[str, ManifestFile] = {}
    for name, cls in (("ours", DataManifestWriter), ("theirs", ManifestWriterV2)):
        for repeat in (1, 2):  # the second of ours uses the kept writer
            path = tmp_path / f"{name}-{repeat}.avro"
            with cls(spec, schema, io.new_output(str(path)), snapshot_id, "deflate") as writer:
                for entry in entries:
                    writer.existing(entry)
            written[f"{name}-{repeat}"] = writer.to_manifest_file()
    theirs = _unsynced(tmp_path / "theirs-1.avro")
    assert _unsynced(tmp_path / "ours-1.avro") == theirs
    assert _unsynced(tmp_path / "ours-2.avro") == theirs
    read = written["ours-2"].fetch_manifest_entry(io, discard_deleted=False)
    assert [e.data_file.file_path for e in read] == [e.data_file.file_path for e in entries]

    ours_list, theirs_list = tmp_path / "ours.list.avro", tmp_path / "theirs.list.avro"
    kept = ManifestListWriterV2Kept(io.new_output(str(ours_list)), snapshot_id, 1, 7, "deflate")
    plain = write_manifest_list(2, io.new_output(str(theirs_list)), snapshot_id, 1, 7, "deflate")
    for lists in (kept, plain):
        with lists:
            lists.add_manifests(manifests)
    assert _unsynced(tmp_path / "ours.list.avro") == _unsynced(tmp_path / "theirs.list.avro")
    again = tuple(read_manifest_list(io.new_input(str(tmp_path / "ours.list.avro"))))
    assert [m.manifest_path for m in again] == [m.manifest_path for m in manifests]
