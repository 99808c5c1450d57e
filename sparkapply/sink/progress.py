"""The applied LSN: which source commit each Iceberg table contains, read back on restart.

Every snapshot sparkapply commits carries ``sparkapply.lsn`` (``X/Y``) in its summary:
the commit LSN of the last source transaction the snapshot contains. A table's
applied LSN is that of the newest snapshot in the current snapshot's lineage that has
one. Snapshots of other writers (a compaction by Spark, a maintenance job) lack the
key, so the lineage is walked back through their parents.

The same LSN is also stored in the table property ``sparkapply.applied-lsn``, set in
the same metadata commit as the snapshot. It answers when the lineage has no snapshot
with the key, which happens when the snapshots sparkapply made were expired after
another writer's snapshot landed on top of them (Java leaves a dangling parent id,
pyiceberg clears it; either way the walk ends empty-handed). An operator can also set
it by hand to start replication into a table loaded by another tool.

The lineage is preferred whenever it answers, because it follows the data: after an
operator rolls the table back, the lineage gives the older LSN (replay re-applies what
the rollback removed) while the property still names the newer one. Rolling back past
sparkapply's *first* snapshot leaves only the property: remove it, or set it to what
the table then contains.
"""

from __future__ import annotations

import logging

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from sparkapply.errors import SinkError
from sparkapply.lsn import Lsn

logger = logging.getLogger(__name__)

LSN_SUMMARY_KEY = "sparkapply.lsn"
"""Snapshot summary key: the commit LSN of the last source transaction applied."""

LSN_TABLE_PROPERTY = "sparkapply.applied-lsn"
"""Table property mirroring the newest ``sparkapply.lsn`` (fallback, see module doc)."""


def applied_lsn(table: Table) -> Lsn | None:
    """The LSN up to which ``table`` contains the source; None if sparkapply never
    committed to it (no ``sparkapply.lsn`` in the lineage, no table property).

    Reads the table object's metadata as loaded (no catalog round trip): call it on a
    freshly loaded table at start-up. An unparsable LSN raises :class:`SinkError`.
    """
    metadata = table.metadata
    name = ".".join(table.name())
    lsn = lineage_lsn(metadata, metadata.current_snapshot_id, table=name)
    if lsn is not None:
        return lsn
    recorded = _property_lsn(metadata, name)
    if recorded is not None and metadata.current_snapshot_id is not None:
        logger.info(
            "table %s: no snapshot in the current lineage has %s (expired?); using table "
            "property %s = %s",
            name,
            LSN_SUMMARY_KEY,
            LSN_TABLE_PROPERTY,
            recorded,
        )
    return recorded


def lineage_lsn(
    metadata: TableMetadata, snapshot_id: int | None, *, table: str | None = None
) -> Lsn | None:
    """The newest ``sparkapply.lsn`` in the lineage of ``snapshot_id``, itself included."""
    current = snapshot_id
    while current is not None:
        snapshot = metadata.snapshot_by_id(current)
        if snapshot is None:  # expired ancestor
            return None
        if snapshot.summary is not None:
            text = snapshot.summary.additional_properties.get(LSN_SUMMARY_KEY)
            if text is not None:
                return _parse(text, table, f"snapshot {current}")
        current = snapshot.parent_snapshot_id
    return None


def _property_lsn(metadata: TableMetadata, table: str) -> Lsn | None:
    text = metadata.properties.get(LSN_TABLE_PROPERTY)
    return None if text is None else _parse(text, table, f"property {LSN_TABLE_PROPERTY}")


def _parse(text: str, table: str | None, where: str) -> Lsn:
    try:
        return Lsn.parse(text)
    except ValueError as exc:
        raise SinkError(
            f"{where} records an invalid LSN {text!r}", table=table, hint="it must be X/Y in hex"
        ) from exc
