"""Insert-only batches, decoded column by column. Executor side.

When the driver has seen only INSERTs for a table in a batch (it peeks every change's
tag), there is no net effect to compute: PostgreSQL's key uniqueness means no insert
of the batch meets a row of the table, and the per-table applied LSN means no batch
is applied twice. So the rows are appended, and they can be decoded without a Python
object per row or per value: within a chunk of spool records, each column's kinds,
lengths and value bytes sit at positions numpy computes for all rows at once, and the
value bytes are gathered into one Arrow binary array that :func:`to_arrow` converts.

Every position is checked against its record's bounds before bytes are gathered, so
a malformed record raises :class:`ProtocolError`, never an IndexError.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from sparkapply.apply.fold import Layout, TxnInput
from sparkapply.apply.merge import TableWriter, WriteResult, _ctype
from sparkapply.changes.spool import RecordChunk, read_chunks
from sparkapply.convert.values import to_arrow
from sparkapply.errors import ApplyError, ProtocolError, SparkapplyError
from sparkapply.pgoutput import Decoder, encode
from sparkapply.pgoutput import messages as m

_I, _R, _U, _D, _T = (ord(c) for c in "IRUDT")
_N, _TEXT, _BIN, _NULL = ord("N"), ord("t"), ord("b"), ord("n")


def _be32(b: np.ndarray, pos: np.ndarray) -> np.ndarray:
    out: np.ndarray = (
        (b[pos].astype(np.int64) << 24)
        | (b[pos + 1].astype(np.int64) << 16)
        | (b[pos + 2].astype(np.int64) << 8)
        | b[pos + 3].astype(np.int64)
    )
    return out


def _malformed(what: str) -> ProtocolError:
    return ProtocolError(f"malformed Insert in the spool: {what}", tag="I")


def decode_insert_run(
    b: np.ndarray, starts: np.ndarray, ends: np.ndarray, in_stream: np.ndarray, layout: Layout
) -> dict[str, pa.Array]:
    """Columns of Insert records (all of one relation layout) as converted Arrow arrays."""
    pos = starts + 1 + np.where(in_stream, 4, 0) + 4  # tag, [xid], relid
    if np.any(pos + 3 > ends) or np.any(b[pos] != _N):
        raise _malformed("no new tuple ('N') where one must be")
    natts = (b[pos + 1].astype(np.int64) << 8) | b[pos + 2].astype(np.int64)
    if np.any(natts != len(layout.names)):
        raise _malformed(f"column count differs from the RELATION ({len(layout.names)})")
    pos = pos + 3
    columns: dict[str, pa.Array] = {}
    for ci, name in enumerate(layout.names):
        if np.any(pos >= ends):
            raise _malformed(f"tuple ends before column {name!r}")
        kind = b[pos]
        isval = kind == _TEXT
        if not np.all(isval | (kind == _NULL)):
            bad = sorted({chr(int(k)) for k in kind[~(isval | (kind == _NULL))]})
            raise _malformed(f"column {name!r} has kind(s) {bad} (expected text or null)")
        vpos = np.where(isval, pos + 1, pos)
        if np.any(isval & (vpos + 4 > ends)):
            raise _malformed(f"length of column {name!r} is cut off")
        ln = np.where(isval, _be32(b, np.where(isval, vpos, 0)), 0)
        if np.any(ln >= 1 << 31) or np.any(isval & (vpos + 4 + ln > ends)):
            raise _malformed(f"value of column {name!r} runs past its record")
        vstart = vpos + 4
        offsets = np.zeros(len(ln) + 1, np.int64)
        np.cumsum(ln, out=offsets[1:])
        total = int(offsets[-1])
        idx = np.arange(total, dtype=np.int64) + np.repeat(vstart - offsets[:-1], ln)
        values = b[idx]
        validity = None if bool(isval.all()) else pa.array(isval).buffers()[1]
        raw = pa.Array.from_buffers(
            pa.large_binary(), len(ln), [validity, pa.py_buffer(offsets), pa.py_buffer(values)]
        )
        try:
            columns[name] = to_arrow(_ctype(layout, ci), raw)
        except SparkapplyError as exc:
            raise exc.with_context(column=name) from None
        pos = np.where(isval, vstart + ln, pos + 1)
    if np.any(pos != ends):
        raise _malformed("trailing bytes after the tuple")
    return columns


class _Appender:
    def __init__(self, schema: pa.Schema, writer: TableWriter) -> None:
        self.schema = schema
        self.writer = writer
        self.parts: list[pa.Table] = []
        self.rows = 0
        self.result = WriteResult()

    def add(self, columns: dict[str, pa.Array], n: int) -> None:
        arrays = []
        for f in self.schema:
            arr = columns.get(f.name)
            arrays.append(pa.nulls(n, f.type) if arr is None else arr.cast(f.type))
        self.parts.append(pa.Table.from_arrays(arrays, schema=self.schema))
        self.rows += n
        if self.rows >= 1_000_000:  # bounded memory: a file per million rows
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
    out = _Appender(schema, writer)
    changes = 0
    for txn in txns:
        layouts = {r.relation_id: Layout.of(r) for r in txn.relations}
        decoders = {
            False: Decoder(proto_version=proto_version, streaming=streaming),
            True: Decoder(proto_version=proto_version, streaming=streaming),
        }
        decoders[True].decode(
            encode(m.StreamStart(txn.xid, True), proto_version=proto_version, streaming=streaming)
        )
        try:
            for seg in txn.segments:
                for chunk in read_chunks(seg):
                    changes += _chunk(chunk, relation_ids, layouts, decoders, out)
        except SparkapplyError as exc:
            raise exc.with_context(xid=txn.xid, lsn=txn.commit_lsn) from None
    out.flush()
    return out.result, changes


def _chunk(
    chunk: RecordChunk,
    relation_ids: frozenset[int],
    layouts: dict[int, Layout],
    decoders: dict[bool, Decoder],
    out: _Appender,
) -> int:
    b = np.frombuffer(chunk.data, np.uint8)
    starts = np.asarray(chunk.starts, np.int64)
    ends = starts + np.asarray(chunk.lengths, np.int64)
    in_stream = np.asarray(chunk.in_stream, bool)
    if np.any(ends - starts < 1):
        raise ProtocolError("empty message in the spool")
    tags = b[starts]
    is_change = (tags == _I) | (tags == _U) | (tags == _D)
    relpos = starts + 1 + np.where(in_stream, 4, 0)
    if np.any(is_change & (relpos + 4 > ends)):
        raise ProtocolError("change message too short for its relation id")
    relids = np.where(is_change, _be32(b, np.where(is_change, relpos, 0)), -1)
    mine = is_change & np.isin(relids, np.fromiter(relation_ids, np.int64))
    if np.any(mine & (tags != _I)):
        raise ApplyError("an UPDATE or DELETE reached the insert-only path")
    # RELATION and TRUNCATE messages are few; walk them in order and cut the inserts
    # into runs that share one layout.
    special = np.flatnonzero((tags == _R) | (tags == _T))
    run_start = 0
    changes = 0
    for i in [*special.tolist(), len(tags)]:
        sel = np.flatnonzero(mine[run_start:i]) + run_start
        # Appends commute, so rows of several relation ids (a table dropped and
        # created again) may be grouped by id.
        for rid in np.unique(relids[sel]).tolist():
            part = sel[relids[sel] == rid]
            layout = layouts.get(rid)
            if layout is None:
                raise ApplyError(f"insert for relation id {rid} before its RELATION message")
            cols = decode_insert_run(b, starts[part], ends[part], in_stream[part], layout)
            out.add(cols, len(part))
            changes += len(part)
        if i < len(tags):
            payload = chunk.data[chunk.starts[i] : chunk.starts[i] + chunk.lengths[i]]
            msg = decoders[chunk.in_stream[i]].decode(payload)
            if isinstance(msg, m.Relation):
                layouts[msg.relation_id] = Layout.of(msg)
            elif isinstance(msg, m.Truncate) and relation_ids.intersection(msg.relation_ids):
                raise ApplyError("a TRUNCATE reached the insert-only path")
        run_start = i + 1
    return changes
