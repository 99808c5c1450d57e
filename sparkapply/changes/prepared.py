"""The durable store of prepared transactions, keyed by xid.

PREPARE makes a transaction durable here before its end LSN may be acknowledged;
COMMIT PREPARED and ROLLBACK PREPARED find it by xid (GIDs repeat and may be empty),
also after a restart. Layout in ``<work_dir>/prepared/``: ``<xid>.spool`` (the
transaction's change records) and ``<xid>.json`` (its metadata). The JSON is written
last with an atomic rename, so an entry exists only once its spool is complete and
fsynced; a spool without JSON is debris from a crash and is ignored. The files are
``state/prepared_files.py``'s; what the metadata says is :class:`PreparedEntry`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkapply.changes.spool import SpoolSegment
from sparkapply.errors import StateError
from sparkapply.lsn import Lsn
from sparkapply.state import prepared_files
from sparkapply.state.layout import prepared_dir, prepared_spool, prepared_xids


@dataclass(frozen=True, slots=True)
class PreparedEntry:
    xid: int
    gid: str
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    n_changes: int
    has_truncate: bool
    relation_ids: frozenset[int]
    mutated_relation_ids: frozenset[int] | None
    spool_path: str
    spool_size: int
    # RELATION payloads (hex in the JSON): the versions in effect when the transaction
    # first touched each relation, and the ones it carried itself.
    start_relations: tuple[bytes, ...]
    own_relations: tuple[bytes, ...]
    streamed: bool  # its own RELATIONs are streamed-scope: apply them at commit

    @property
    def segment(self) -> SpoolSegment:
        return SpoolSegment(self.spool_path, 0, self.spool_size)

    def to_json(self) -> dict[str, Any]:
        """The entry's metadata file contents (the spool's path is where the file is)."""
        return {
            "xid": self.xid,
            "gid": self.gid,
            "prepare_lsn": str(self.prepare_lsn),
            "end_lsn": str(self.end_lsn),
            "prepare_time": self.prepare_time,
            "n_changes": self.n_changes,
            "has_truncate": self.has_truncate,
            "relation_ids": sorted(self.relation_ids),
            "mutated_relation_ids": (
                None if self.mutated_relation_ids is None else sorted(self.mutated_relation_ids)
            ),
            "spool_size": self.spool_size,
            "start_relations": [p.hex() for p in self.start_relations],
            "own_relations": [p.hex() for p in self.own_relations],
            "streamed": self.streamed,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, spool_path: str) -> PreparedEntry:
        """The entry :meth:`to_json` wrote; ``mutated_relation_ids`` may be missing
        (entries written before it existed: None, every relation counts as mutated)."""
        mutated = raw.get("mutated_relation_ids")
        return cls(
            xid=raw["xid"],
            gid=raw["gid"],
            prepare_lsn=Lsn.parse(raw["prepare_lsn"]),
            end_lsn=Lsn.parse(raw["end_lsn"]),
            prepare_time=raw["prepare_time"],
            n_changes=raw["n_changes"],
            has_truncate=raw["has_truncate"],
            relation_ids=frozenset(raw["relation_ids"]),
            mutated_relation_ids=None if mutated is None else frozenset(mutated),
            spool_path=spool_path,
            spool_size=raw["spool_size"],
            start_relations=tuple(bytes.fromhex(p) for p in raw["start_relations"]),
            own_relations=tuple(bytes.fromhex(p) for p in raw["own_relations"]),
            streamed=raw["streamed"],
        )


class PreparedStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def in_work_dir(cls, work_dir: Path) -> PreparedStore:
        """The store of the subscriber whose work dir is ``work_dir``."""
        return cls(prepared_dir(work_dir))

    def stage(
        self,
        *,
        xid: int,
        gid: str,
        prepare_lsn: int,
        end_lsn: int,
        prepare_time: int,
        n_changes: int,
        has_truncate: bool,
        relation_ids: frozenset[int],
        mutated_relation_ids: frozenset[int],
        start_relations: tuple[bytes, ...],
        own_relations: tuple[bytes, ...],
        streamed: bool,
        source: SpoolSegment,
        move: bool,
        keep_source: bool = False,
    ) -> PreparedEntry:
        """Make the transaction durable. ``move`` renames a whole stream file in;
        ``keep_source`` links it instead (staging tasks still read it by its name)."""
        spool = prepared_files.take_spool(
            self.root,
            xid,
            source.path,
            source.start,
            source.end,
            move=move,
            keep_source=keep_source,
        )
        entry = PreparedEntry(
            xid=xid,
            gid=gid,
            prepare_lsn=Lsn(prepare_lsn),
            end_lsn=Lsn(end_lsn),
            prepare_time=prepare_time,
            n_changes=n_changes,
            has_truncate=has_truncate,
            relation_ids=relation_ids,
            mutated_relation_ids=mutated_relation_ids,
            spool_path=str(spool),
            spool_size=source.end - source.start,
            start_relations=start_relations,
            own_relations=own_relations,
            streamed=streamed,
        )
        prepared_files.write_meta(self.root, xid, entry.to_json())
        return entry

    def get(self, xid: int) -> PreparedEntry | None:
        raw = prepared_files.read_meta(self.root, xid)
        if raw is None:
            return None
        spool = prepared_spool(self.root, xid)
        size = prepared_files.spool_size(self.root, xid)
        if size is None or size < raw["spool_size"]:
            raise StateError(
                f"prepared transaction xid {xid} (gid {raw['gid']!r}) has lost its spool {spool}",
                xid=xid,
                hint="the work_dir was damaged; drop the slot and resync the tables",
            )
        return PreparedEntry.from_json(raw, spool_path=str(spool))

    def remove(self, xid: int) -> None:
        prepared_files.remove(self.root, xid)

    def xids(self) -> list[int]:
        return prepared_xids(self.root)

    def clear(self) -> None:
        prepared_files.clear(self.root)


def pending_prepared(work_dir: Path) -> list[PreparedEntry]:
    """Staged prepared transactions, by xid, read from outside the subscriber too
    (``status``, the metrics, ``skip``): creates nothing, and leaves out those
    committed or rolled back while it reads."""
    root = prepared_dir(work_dir)
    if not root.is_dir():
        return []
    store = PreparedStore(root)
    out = []
    for xid in store.xids():
        try:
            entry = store.get(xid)
        except StateError:  # committed or rolled back while we read it
            continue
        if entry is not None:
            out.append(entry)
    return out
