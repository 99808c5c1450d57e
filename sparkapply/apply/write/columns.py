"""PostgreSQL text columns into the table's Arrow schema: the one place that fits them.

Every path that writes rows (the folds, the insert-only path, the initial copy)
converts a column's text with :func:`~sparkapply.convert.values.to_arrow` for the
column's PostgreSQL type (or as text: an array the table stores as text), then casts
it to the Iceberg table's Arrow type (a column may have been widened, e.g. int →
bigint) and fills the columns a relation version lacks with nulls.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from sparkapply.apply.fold.rowwise import Layout
from sparkapply.convert.types import TEXT_OID, ColumnKind, PgColumnType, column_target
from sparkapply.convert.values import ColumnValues, to_arrow
from sparkapply.errors import ConversionError, SparkapplyError


def cast_to_field(arr: pa.Array | pa.ChunkedArray, f: pa.Field) -> pa.Array | pa.ChunkedArray:
    """``arr`` as the type of table column ``f`` (a no-op when it already is)."""
    if arr.type == f.type:
        return arr
    try:
        return arr.cast(f.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConversionError(
            f"cannot store {arr.type} values in column of type {f.type}: {exc}", column=f.name
        ) from exc


def convert_column(ctype: PgColumnType, values: ColumnValues, f: pa.Field) -> pa.Array:
    """One column of PostgreSQL text values, typed as table column ``f``."""
    try:
        return cast_to_field(to_arrow(stored_type(ctype, f), values), f)
    except SparkapplyError as exc:
        raise exc.with_context(column=f.name) from None


def stored_type(ctype: PgColumnType, f: pa.Field) -> PgColumnType:
    """What to convert a column's text as: its PostgreSQL type, or text for an array
    column the table stores as text (declared with more than one dimension, see
    ``convert/types.py``, ARRAYS OF MORE THAN ONE DIMENSION)."""
    if pa.types.is_large_string(f.type) and column_target(ctype).kind is ColumnKind.LIST:
        return PgColumnType(TEXT_OID, -1)
    return ctype


def convert_columns(
    layout: Layout, raw: Mapping[str, ColumnValues], schema: pa.Schema
) -> dict[str, pa.Array]:
    """Convert the named columns of a relation version (``layout``); columns the table
    does not have are left out."""
    out: dict[str, pa.Array] = {}
    for ci, name in enumerate(layout.names):
        if name not in raw or schema.get_field_index(name) < 0:
            continue
        ctype = PgColumnType(layout.type_oids[ci], layout.type_modifiers[ci])
        out[name] = convert_column(ctype, raw[name], schema.field(name))
    return out


def fit_table(
    columns: Mapping[str, pa.Array | pa.ChunkedArray], n: int, schema: pa.Schema
) -> pa.Table:
    """A table in ``schema`` from typed columns; absent columns are null."""
    arrays = []
    for f in schema:
        arr = columns.get(f.name)
        arrays.append(pa.nulls(n, f.type) if arr is None else cast_to_field(arr, f))
    return pa.Table.from_arrays(arrays, schema=schema)
