"""Reading a table back into Arrow, for tests, examples and checks (not the apply path)."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.table import Table


def read_table(table: Table, *, snapshot_id: int | None = None) -> pa.Table:
    """The table's rows at its current snapshot (or ``snapshot_id``), all in memory.

    Files written without field ids are resolved through the table's name mapping,
    and columns added after a file was written read as null, as in every engine.
    """
    return table.scan(snapshot_id=snapshot_id).to_arrow()
