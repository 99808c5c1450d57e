"""Columns whose values in older rows the stream never sent: when a RELATION means a
table must be copied again (see copy/driver.py, COLUMNS THAT ARRIVE WITH VALUES).

A RELATION names a table's published columns and their types, nothing of their
history. The publisher's catalog has the rest: a column's number (``attnum``, never
reused, so a column dropped and added again under its name has a new one), and
whether its older rows were given values (a default, the fast default PostgreSQL
keeps for rows older than the column, an identity, a generation expression). The
table's Iceberg properties keep what the mirror's rows were made from: the number of
each column it mirrors (:data:`SOURCE_COLUMNS_PROPERTY`), and the highest column
number the relation had when it was copied (:data:`LAST_ATTNUM_PROPERTY`: a column
numbered at or below it existed then, unpublished). :func:`judge` compares the two;
it is pure, the queries and the properties are the caller's.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from pyiceberg.table import Table

SOURCE_COLUMNS_PROPERTY = "sparkapply.source-columns"
"""Table property: JSON, the number (attnum) of each source column the rows mirror."""
LAST_ATTNUM_PROPERTY = "sparkapply.source-last-attnum"
"""Table property: the highest column number the relation had when it was copied."""


@dataclass(frozen=True, slots=True)
class CatalogColumn:
    """A column as the publisher's catalog has it now."""

    attnum: int
    filled: bool  # older rows got values: a default, a fast default, identity, generated


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a RELATION means for a table's rows: the columns whose older rows may hold
    values the mirror lacks (copy it again if any), and its column numbers after."""

    copy_again: tuple[str, ...]
    numbers: dict[str, int]


def judge(
    names: Sequence[str],
    numbers: Mapping[str, int] | None,
    held: Collection[str],
    last_attnum: int,
    catalog: Mapping[str, CatalogColumn],
) -> Verdict:
    """``names``: a RELATION's columns; ``numbers``: the table's recorded column numbers
    (None: a table copied before they were recorded, whose columns ``held`` are taken
    as they are now); ``catalog``: the columns of ``names`` the catalog still has.

    A column whose number changed was dropped and added again: the mirror's values
    are the old column's. A column the table has no number for is new to the mirror:
    its older rows hold values if the catalog says they were filled, or if it existed
    when the table was copied (a column added to the publication's column list, or
    renamed from one the mirror had). A plain ``ADD COLUMN`` is neither: null in the
    older rows on the publisher too."""
    after = (
        dict(numbers)
        if numbers is not None
        else {n: catalog[n].attnum for n in names if n in held and n in catalog}
    )
    again = []
    for name in names:
        column = catalog.get(name)
        if column is None:  # dropped since this RELATION was sent: no row to mend
            continue
        known = after.get(name)
        added_again = known is not None and known != column.attnum
        filled = known is None and (column.filled or column.attnum <= last_attnum)
        if added_again or filled:
            again.append(name)
        after[name] = column.attnum
    return Verdict(tuple(again), after)


def catalog_columns(
    conn: psycopg.Connection[Any], relation_oid: int, names: Collection[str]
) -> dict[str, CatalogColumn]:
    """The columns of ``names`` the relation has now (see :class:`CatalogColumn`)."""
    rows = conn.execute(
        "SELECT attname, attnum, atthasdef OR atthasmissing OR attidentity <> '' "
        "OR attgenerated <> '' FROM pg_attribute "
        "WHERE attrelid = %s AND attname = ANY(%s) AND attnum > 0 AND NOT attisdropped",
        (relation_oid, list(names)),
    ).fetchall()
    return {str(name): CatalogColumn(int(attnum), bool(filled)) for name, attnum, filled in rows}


def recorded_numbers(table: Table) -> dict[str, int] | None:
    """:data:`SOURCE_COLUMNS_PROPERTY`; None when not recorded (or unreadable)."""
    text = table.properties.get(SOURCE_COLUMNS_PROPERTY)
    if text is None:
        return None
    try:
        doc = json.loads(text)
        return {str(k): int(v) for k, v in doc.items()}
    except (ValueError, TypeError, AttributeError):
        return None


def recorded_last_attnum(table: Table) -> int:
    """:data:`LAST_ATTNUM_PROPERTY`, or 0 for a table copied before it was recorded."""
    text = table.properties.get(LAST_ATTNUM_PROPERTY, "")
    return int(text) if text.isdigit() else 0


def numbers_property(numbers: Mapping[str, int]) -> dict[str, str]:
    return {SOURCE_COLUMNS_PROPERTY: json.dumps(dict(sorted(numbers.items())))}
