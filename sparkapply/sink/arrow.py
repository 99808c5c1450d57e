"""The Arrow schema executors write a table's data files in."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table


def arrow_schema_of(table: Table) -> pa.Schema:
    """Column names and types of the table's current schema, without field ids.

    Files carry no field ids; the table's name mapping resolves them by name.
    """
    schema = schema_to_pyarrow(table.schema(), include_field_ids=False)
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])
