"""Snapshot expiry: what keeps a commit's cost flat over a table's lifetime.

A commit costs time proportional to the number of snapshots the table keeps (pyiceberg
deep-copies the whole table metadata a dozen times per commit; the metadata file
written per commit lists every snapshot). On a 2-core machine a 1-file commit takes
~20 ms on a new table and ~0.6 s after 300 snapshots, so a subscriber committing
every second must expire snapshots regularly, as every streaming Iceberg writer does.

Expiry here only removes snapshots from the metadata. The data and manifest files
only they referenced stay on storage until an orphan-file sweep (Spark's
``remove_orphan_files``/``expire_snapshots`` procedures) deletes them. The applied
LSN survives expiry (``progress.py``: the ``sparkapply.applied-lsn`` property).
"""

from __future__ import annotations

import datetime as dt
import logging

from pyiceberg.table import Table

from sparkapply.errors import SinkArgumentError, SinkError
from sparkapply.sink.tables import table_name

logger = logging.getLogger(__name__)


def expire_snapshots(table: Table, *, older_than: dt.datetime, retain_last: int = 1) -> int:
    """Expire the snapshots older than ``older_than`` (aware datetime) but keep at
    least the ``retain_last`` newest and every branch or tag head; return how many
    were expired. One metadata commit; a concurrent commit makes it a
    :class:`SinkError` that can simply be retried later."""
    if older_than.tzinfo is None:
        raise SinkArgumentError("older_than must be timezone-aware", table=table_name(table))
    if retain_last < 1:
        raise SinkArgumentError("retain_last must be at least 1", table=table_name(table))
    stamps = sorted(s.timestamp_ms for s in table.metadata.snapshots)
    cutoff_ms = int(older_than.timestamp() * 1000)
    if len(stamps) <= retain_last:
        return 0
    # Snapshots strictly older than the cutoff go; the retain_last newest are not.
    cutoff_ms = min(cutoff_ms, stamps[-retain_last])
    doomed = sum(1 for stamp in stamps if stamp < cutoff_ms)
    if doomed == 0:
        return 0
    cutoff = dt.datetime.fromtimestamp(cutoff_ms / 1000, tz=dt.UTC)
    before = len(table.metadata.snapshots)
    try:
        table.maintenance.expire_snapshots().older_than(cutoff).commit()
    except Exception as exc:
        raise SinkError(
            f"cannot expire snapshots: {type(exc).__name__}: {exc}",
            table=table_name(table),
            hint="expiry is maintenance; it can be retried at the next interval",
        ) from exc
    expired = before - len(table.metadata.snapshots)
    logger.info("expired %d snapshots of %s", expired, table_name(table))
    return expired
