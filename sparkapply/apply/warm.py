"""One tiny table task, run where workers are forked from, before they are.

A Python worker's first task pays for more than imports: pyarrow's compute kernels,
the Parquet writer and numpy's code paths set themselves up on first use. When small
batches fold on the driver (``[apply] driver_fold_bytes``), a steady stream of them
runs no Spark job for minutes, and the first big batch after it paid that set-up in
its job (0.1 s on a 200,000-row batch). ``daemon.py`` runs :func:`warm_up` once
before it forks, so every worker starts with it done.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa

from sparkapply.apply.fold.rowwise import TxnInput
from sparkapply.apply.tasks import TableTask, run_table_task
from sparkapply.changes.spool import SpoolSegment, SpoolWriter
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m
from sparkapply.storage import Storage

_REL = m.Relation(
    None,
    1,
    "warm",
    "up",
    "d",
    (m.RelationColumn(1, "id", 20, -1), m.RelationColumn(0, "v", 25, -1)),
)


def _row(key: int, value: str) -> m.TupleData:
    return m.TupleData(b"tt", (str(key).encode(), value.encode()))


def warm_up() -> None:
    """Fold and write a few changes through the keyed and the insert-only paths."""
    with tempfile.TemporaryDirectory(prefix="sparkapply-warm-") as tmp:
        writer = SpoolWriter(Path(tmp) / "warm.spool")
        inserts: list[m.Message] = [_REL, m.Insert(None, 1, _row(1, "a"))]
        changes: list[m.Message] = [
            m.Update(None, 1, None, None, _row(1, "c")),
            m.Delete(None, 1, "K", _row(1, "c")),
        ]
        for msg in inserts:
            writer.append(encode(msg), False)
        inserted = writer.offset
        for msg in changes:
            writer.append(encode(msg), False)
        writer.close()
        schema = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
        for insert_only, end in ((False, writer.offset), (True, inserted)):
            txn = TxnInput(0, 1, 1, (SpoolSegment(str(writer.path), 0, end),), ())
            run_table_task(
                TableTask(
                    table="warm.up",
                    relation_ids=frozenset({1}),
                    key_names=("id",),
                    txns=(txn,),
                    schema=schema,
                    data_files=(),
                    delete_files=(),
                    data_dir=str(Path(tmp) / "data"),
                    proto_version=4,
                    streaming="parallel",
                    insert_only=insert_only,
                    storage=Storage(),  # a local directory
                )
            )
