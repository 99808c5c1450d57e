"""Insert-only batches, decoded column by column and appended. Executor side.

When the driver has seen only INSERTs for a table in a batch (it peeks every change's
tag), there is no net effect to compute: PostgreSQL's key uniqueness means no insert
of the batch meets a row of the table, and the per-table applied LSN means no batch
is applied twice. So the rows are decoded column-wise (``pgoutput/columnar.py``) and
appended, without a Python object per row or per value, and without the event kernel
(``events.py``) the folds that net changes share.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from sparkapply.apply.fold.chunks import indexed_chunks
from sparkapply.apply.fold.rowwise import Layout, TxnInput, coalesced, uncoalesced
from sparkapply.apply.write.columns import convert_columns, fit_table
from sparkapply.apply.write.effect import ROWS_PER_FILE, WriteResult
from sparkapply.apply.write.parquet import TableWriter
from sparkapply.errors import ApplyError, NotInsertOnly, SparkapplyError
from sparkapply.pgoutput import Decoder
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.columnar import ChunkIndex, decode_changes, stream_decoders


class _Appender:
    def __init__(self, schema: pa.Schema, writer: TableWriter) -> None:
        self.schema = schema
        self.writer = writer
        self.parts: list[pa.Table] = []
        self.rows = 0
        self.result = WriteResult()

    def add(self, columns: dict[str, pa.Array], n: int) -> None:
        self.parts.append(fit_table(columns, n, self.schema))
        self.rows += n
        if self.rows >= ROWS_PER_FILE:  # bounded memory: a file per million rows
            self.flush()

    def flush(self) -> None:
        if self.parts:
            table = pa.concat_tables(self.parts)
            self.result.added.append(self.writer.write(table))
            self.result.rows_written += table.num_rows
            self.parts, self.rows = [], 0


def append_inserts(
    relation_ids: frozenset[int],
    txns: Sequence[TxnInput],
    *,
    schema: pa.Schema,
    writer: TableWriter,
    proto_version: int = 4,
    streaming: str = "parallel",
) -> tuple[WriteResult, int]:
    """Write every insert of ``txns`` for the table; (files, number of changes)."""
    groups = coalesced(txns)
    try:
        return _append(relation_ids, groups, schema, writer, proto_version, streaming)
    except SparkapplyError:
        if all(g.members == 1 for g in groups):
            raise
    # Name the exact transaction (the files written so far are orphans the driver removes).
    return _append(relation_ids, uncoalesced(txns), schema, writer, proto_version, streaming)


def _append(
    relation_ids: frozenset[int],
    txns: Sequence[TxnInput],
    schema: pa.Schema,
    writer: TableWriter,
    proto_version: int,
    streaming: str,
) -> tuple[WriteResult, int]:
    out = _Appender(schema, writer)
    changes = 0
    for txn in txns:
        layouts = {r.relation_id: Layout.of(r) for r in txn.relations}
        decoders = stream_decoders(proto_version, streaming)
        try:
            for seg in txn.segments:
                for ix in indexed_chunks(seg):
                    changes += _chunk(ix, relation_ids, layouts, decoders, out)
        except SparkapplyError as exc:
            raise exc.with_context(xid=txn.xid, lsn=txn.commit_lsn) from None
    out.flush()
    return out.result, changes


def _chunk(
    ix: ChunkIndex,
    relation_ids: frozenset[int],
    layouts: dict[int, Layout],
    decoders: dict[bool, Decoder],
    out: _Appender,
) -> int:
    changes = 0
    for i, rows in ix.runs(relation_ids):
        if rows is None:
            msg = decoders[bool(ix.in_stream[i])].decode(ix.payload(i))
            if isinstance(msg, m.Relation):
                layouts[msg.relation_id] = Layout.of(msg)
            elif isinstance(msg, m.Truncate) and relation_ids.intersection(msg.relation_ids):
                raise NotInsertOnly("a TRUNCATE reached the insert-only path")
            continue
        if np.any(ix.tags[rows] != m.TAG_INSERT):
            raise NotInsertOnly("an UPDATE or DELETE reached the insert-only path")
        # Appends commute, so rows of several relation ids (a table dropped and
        # created again) may be grouped by id.
        for rid in np.unique(ix.relids[rows]).tolist():
            part = rows[ix.relids[rows] == rid]
            layout = layouts.get(rid)
            if layout is None:
                raise ApplyError(f"insert for relation id {rid} before its RELATION message")
            run = decode_changes(
                ix.b, ix.starts[part], ix.ends[part], ix.in_stream[part], rid, layout.names
            )
            raw = dict(zip(layout.names, run.new.values, strict=True))
            out.add(convert_columns(layout, raw, out.schema), len(part))
            changes += len(part)
    return changes
