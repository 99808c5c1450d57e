"""Which Arrow and Iceberg type each PostgreSQL column type becomes.

This module owns the type mapping and the one table of PostgreSQL type OIDs. It imports
only pyarrow (it is used inside Spark executors); the Iceberg type objects themselves
are built from a :class:`ColumnTarget` by :mod:`sparkapply.convert.schema`.

TYPE MAPPING

The replication connection uses the text format, so every value arrives as
PostgreSQL's text output. A type maps to a native Iceberg type when the text converts
exactly; everything else is kept as its text, which is always lossless.

| PostgreSQL                                   | Arrow                  | Iceberg            |
|----------------------------------------------|------------------------|--------------------|
| int2, int4                                   | int32                  | int                |
| int8, oid                                    | int64                  | long               |
| float4                                       | float32                | float              |
| float8                                       | float64                | double             |
| numeric(p,s), 1 <= p <= 38, 0 <= s <= p      | decimal128(p,s)        | decimal(p,s)       |
| numeric, numeric(p>38), numeric(p,s<0 or >p) | large_string           | string (text form) |
| bool                                         | bool                   | boolean            |
| text, varchar, bpchar, name, "char"          | large_string           | string             |
| bytea                                        | large_binary           | binary             |
| date                                         | date32                 | date               |
| time                                         | time64(us)             | time               |
| timestamp                                    | timestamp(us)          | timestamp          |
| timestamptz                                  | timestamp(us, UTC)     | timestamptz        |
| uuid                                         | uuid (extension)       | uuid               |
| json, jsonb, xml, timetz, interval, inet,    | large_string           | string (text form) |
| cidr, macaddr, money, bit, ranges, tsvector, |                        |                    |
| geometric types, any other built-in type     |                        |                    |
| enums, domains, any user type (OID >= 16384) | large_string           | string (text form) |
| one-dimensional array of a type above        | large_list<element>    | list<element>      |
| array declared with 2+ dimensions (int[][])  | large_string           | string (text form) |

Strings, binaries and lists use Arrow's 64-bit-offset ("large") layouts: they are what
pyiceberg's own ``schema_to_pyarrow`` produces, so the sink can concatenate converted
chunks with data read back from Iceberg without a cast, and one chunk of big TOASTed
values cannot overflow 32-bit offsets.

uuid is Arrow's canonical ``arrow.uuid`` extension type (storage fixed_size_binary(16)).
It is what pyiceberg 0.12 maps UUIDType to and from, and pyarrow writes it as Parquet
``FIXED_LEN_BYTE_ARRAY(16)`` with the UUID logical type, the physical type the Iceberg
spec prescribes; both ``Table.append`` and ``Table.add_files`` of such files read back
as ``uuid``. (A bare fixed_size_binary(16) is also accepted by pyiceberg, but then the
Parquet file lacks the UUID annotation and pyiceberg's type inference says fixed[16].)

SPECIAL VALUES

| PostgreSQL value (text form)                    | becomes                                      |
|-------------------------------------------------|----------------------------------------------|
| float4/float8 NaN, Infinity, -Infinity, -0      | IEEE NaN, +inf, -inf, -0.0 (lossless)        |
| numeric(p,s) NaN                                | null (a decimal has no NaN)                  |
| numeric(p,s) Infinity, -Infinity                | cannot occur (PostgreSQL rejects it for a    |
|                                                 | constrained numeric); ConversionError if seen|
| unconstrained numeric NaN, Infinity, -Infinity  | the text, unchanged (the column is a string) |
| date infinity / -infinity                       | 9999-12-31 / 0001-01-01                      |
| date before 0001-01-01 (BC) or after 9999-12-31 | clamped to 0001-01-01 / 9999-12-31           |
| timestamp, timestamptz infinity / -infinity     | 9999-12-31 23:59:59.999999 / 0001-01-01 00:00|
| timestamp, timestamptz outside that range (BC,  | clamped to the nearer end (timestamptz is    |
| 5+ digit years)                                 | compared after conversion to UTC)            |
| timestamptz with a seconds offset (+05:53:28)   | exact UTC instant                            |
| time 24:00:00                                   | 23:59:59.999999 (Iceberg time is < 24 hours) |
| array with bounds, e.g. [0:1]={5,6}             | the elements; the lower bound is dropped     |
| multi-dimensional array in a column declared    | its text, unchanged (see ARRAYS OF MORE      |
| with more than one dimension (int[][])          | THAN ONE DIMENSION)                          |
| multi-dimensional array in a list column        | ConversionError, with the way out            |
| bytea in the escape output format               | the same bytes (decoded per value, slower)   |
| text that is not valid UTF-8                    | ConversionError                              |

Why clamp to 0001..9999: that is the range every reader of the tables (Spark, Trino,
DuckDB, pyiceberg/Python ``datetime``) represents, PostgreSQL's ``infinity`` is used as
"open end", and the edges keep that meaning in range comparisons. The clamp is
deterministic (the same input always gives the same value) and lossy only for values
that no mainstream reader could show anyway.

ARRAYS OF MORE THAN ONE DIMENSION

An Iceberg list has one nesting depth for every row, a PostgreSQL array column does not:
its type (``int4[]``) says nothing of the dimensions, and any row may hold a matrix.
pgoutput's RELATION message says only the type, so the stream cannot tell. The catalog
can: ``pg_attribute.attndims`` is the number of dimensions a column was declared with
(``int4[][]`` is 2; PostgreSQL does not enforce it). The initial copy and a resync
describe a column declared with more than one dimension as ``text``
(:data:`TEXT_OID`, ``copy/snapshot.py``), so the Iceberg column is a string of
PostgreSQL's array literal, which holds any shape; afterwards the stream's values for
it are converted as text because the table stores text (``apply/write/columns.py``).
A column declared with one dimension (or none: ``CREATE TABLE AS`` records none) is a
list; a multi-dimensional value in it stops the apply with a ConversionError that says
how to go on: declare the dimensions (``ALTER COLUMN ... TYPE int4[][]`` rewrites
nothing) and resync the table.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import pyarrow as pa

from sparkapply.errors import UnsupportedTypeError
from sparkapply.pgoutput.messages import Relation

# First OID not assigned by initdb; types at or above it are user-defined (enums,
# domains, composites, extension types such as citext) and arrive with a Type message.
FIRST_NORMAL_OID = 16384

# pg_type's text: what a column stored as text is converted as.
TEXT_OID = 25

# Iceberg's decimal precision limit (decimal128).
MAX_DECIMAL_PRECISION = 38


class ColumnKind(enum.Enum):
    """The target shape of a column; one value per Iceberg type we produce."""

    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    DECIMAL = "decimal"
    BOOLEAN = "boolean"
    STRING = "string"
    BINARY = "binary"
    DATE = "date"
    TIME = "time"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    UUID = "uuid"
    LIST = "list"


@dataclass(frozen=True, slots=True)
class PgColumnType:
    """A PostgreSQL column type as a RELATION message describes it.

    ``type_name`` comes from a Type message (user types such as enums and domains) and
    is used only to name the type in messages; built-in types leave it ``None``.
    """

    type_oid: int
    type_modifier: int
    type_name: str | None = None


@dataclass(frozen=True, slots=True)
class ColumnTarget:
    """What a column converts to: the kind plus its parameters.

    ``precision``/``scale`` are set for DECIMAL; ``element`` and ``delimiter`` (the
    PostgreSQL array element separator) for LIST.
    """

    kind: ColumnKind
    precision: int = 0
    scale: int = 0
    element: ColumnTarget | None = None
    delimiter: str = ","

    @property
    def arrow_type(self) -> pa.DataType:
        if self.kind is ColumnKind.DECIMAL:
            return pa.decimal128(self.precision, self.scale)
        if self.kind is ColumnKind.LIST:
            assert self.element is not None
            return pa.large_list(pa.field("element", self.element.arrow_type))
        return _ARROW_TYPES[self.kind]

    @property
    def iceberg_name(self) -> str:
        """The Iceberg type as the spec spells it (``decimal(10, 2)``, ``list<long>``)."""
        if self.kind is ColumnKind.DECIMAL:
            return f"decimal({self.precision}, {self.scale})"
        if self.kind is ColumnKind.LIST:
            assert self.element is not None
            return f"list<{self.element.iceberg_name}>"
        return str(self.kind.value)


_ARROW_TYPES: dict[ColumnKind, pa.DataType] = {
    ColumnKind.INT: pa.int32(),
    ColumnKind.LONG: pa.int64(),
    ColumnKind.FLOAT: pa.float32(),
    ColumnKind.DOUBLE: pa.float64(),
    ColumnKind.BOOLEAN: pa.bool_(),
    ColumnKind.STRING: pa.large_string(),
    ColumnKind.BINARY: pa.large_binary(),
    ColumnKind.DATE: pa.date32(),
    ColumnKind.TIME: pa.time64("us"),
    ColumnKind.TIMESTAMP: pa.timestamp("us"),
    ColumnKind.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
    ColumnKind.UUID: pa.uuid(),
}

# ---------------------------------------------------------------------------------
# THE OID TABLE: built-in base types (pg_type.dat, PostgreSQL 16), one a line: OID,
# name, kind, and the OID of its array type (pg_type.typarray; an array column's type
# modifier is its element's modifier). Anything built-in that is not listed
# (pseudo-types, catalog row types) is text too. numeric is listed as string;
# column_target() refines it by type modifier. oid is unsigned 32-bit, so it needs a
# long; int2vector and oidvector print space-separated, not as array literals.
# ---------------------------------------------------------------------------------
_NUMERIC_OID = 1700
_BOX_OID = 603  # the one built-in type whose array delimiter is ';', not ','

_OID_TABLE = """
16    bool            boolean      1000
17    bytea           binary       1001
18    char            string       1002
19    name            string       1003
20    int8            long         1016
21    int2            int          1005
22    int2vector      string       1006
23    int4            int          1007
24    regproc         string       1008
25    text            string       1009
26    oid             long         1028
27    tid             string       1010
28    xid             string       1011
29    cid             string       1012
30    oidvector       string       1013
114   json            string       199
142   xml             string       143
600   point           string       1017
601   lseg            string       1018
602   path            string       1019
603   box             string       1020
604   polygon         string       1027
628   line            string       629
650   cidr            string       651
700   float4          float        1021
701   float8          double       1022
718   circle          string       719
774   macaddr8        string       775
790   money           string       791
829   macaddr         string       1040
869   inet            string       1041
1033  aclitem         string       1034
1042  bpchar          string       1014
1043  varchar         string       1015
1082  date            date         1182
1083  time            time         1183
1114  timestamp       timestamp    1115
1184  timestamptz     timestamptz  1185
1186  interval        string       1187
1266  timetz          string       1270
1560  bit             string       1561
1562  varbit          string       1563
1700  numeric         string       1231
1790  refcursor       string       2201
2202  regprocedure    string       2207
2203  regoper         string       2208
2204  regoperator     string       2209
2205  regclass        string       2210
2206  regtype         string       2211
2950  uuid            uuid         2951
2970  txid_snapshot   string       2949
3220  pg_lsn          string       3221
3614  tsvector        string       3643
3615  tsquery         string       3645
3642  gtsvector       string       3644
3734  regconfig       string       3735
3769  regdictionary   string       3770
3802  jsonb           string       3807
3904  int4range       string       3905
3906  numrange        string       3907
3908  tsrange         string       3909
3910  tstzrange       string       3911
3912  daterange       string       3913
3926  int8range       string       3927
4072  jsonpath        string       4073
4089  regnamespace    string       4090
4096  regrole         string       4097
4191  regcollation    string       4192
4451  int4multirange  string       6150
4532  nummultirange   string       6151
4533  tsmultirange    string       6152
4534  tstzmultirange  string       6153
4535  datemultirange  string       6155
4536  int8multirange  string       6157
5038  pg_snapshot     string       5039
5069  xid8            string       271
"""


def _read_oid_table(table: str) -> tuple[dict[int, tuple[str, ColumnKind]], dict[int, int]]:
    """The (name, kind) of each type OID, and the element type OID of each array OID."""
    scalars: dict[int, tuple[str, ColumnKind]] = {}
    arrays: dict[int, int] = {}
    for line in table.strip().splitlines():
        oid, name, kind, array = line.split()
        scalars[int(oid)] = (name, ColumnKind(kind))
        if array != "-":
            arrays[int(array)] = int(oid)
    return scalars, arrays


_SCALARS, _ARRAYS = _read_oid_table(_OID_TABLE)

_VARHDRSZ = 4


def numeric_precision_scale(type_modifier: int) -> tuple[int, int] | None:
    """Decode a numeric type modifier into (precision, scale); None if unconstrained.

    PostgreSQL 15+ stores the scale as an 11-bit two's-complement field (scales from
    -1000 to 1000), so it is sign-extended here.
    """
    if type_modifier < _VARHDRSZ:
        return None
    tm = type_modifier - _VARHDRSZ
    precision = (tm >> 16) & 0xFFFF
    scale = ((tm & 0x7FF) ^ 1024) - 1024
    return precision, scale


@functools.lru_cache(maxsize=1024)
def column_target(ctype: PgColumnType) -> ColumnTarget:
    """Map a PostgreSQL column type to what its values convert to.

    Never fails for a valid OID: unknown and user types become strings (their text
    form). Raises :class:`UnsupportedTypeError` only for OID 0 (InvalidOid).
    """
    oid = ctype.type_oid
    if oid <= 0:
        raise UnsupportedTypeError(
            f"invalid column type OID {oid}",
            hint="the RELATION message is malformed; check the publisher's version",
        )
    element_oid = _ARRAYS.get(oid)
    if element_oid is not None:
        element = _scalar_target(element_oid, ctype.type_modifier)
        delimiter = ";" if element_oid == _BOX_OID else ","
        return ColumnTarget(ColumnKind.LIST, element=element, delimiter=delimiter)
    return _scalar_target(oid, ctype.type_modifier)


def _scalar_target(oid: int, type_modifier: int) -> ColumnTarget:
    if oid == _NUMERIC_OID:
        ps = numeric_precision_scale(type_modifier)
        if ps is not None:
            precision, scale = ps
            if 1 <= precision <= MAX_DECIMAL_PRECISION and 0 <= scale <= precision:
                return ColumnTarget(ColumnKind.DECIMAL, precision=precision, scale=scale)
        # Unconstrained, wider than decimal128, or a scale Iceberg cannot express:
        # the text form is the only lossless representation.
        return ColumnTarget(ColumnKind.STRING)
    entry = _SCALARS.get(oid)
    return ColumnTarget(entry[1] if entry is not None else ColumnKind.STRING)


def pg_type_name(ctype: PgColumnType) -> str:
    """A readable name for messages: ``numeric(10,2)``, ``varchar(20)``, ``int4[]``."""
    oid = ctype.type_oid
    element_oid = _ARRAYS.get(oid)
    if element_oid is not None:
        return _scalar_name(element_oid, ctype.type_modifier, None) + "[]"
    return _scalar_name(oid, ctype.type_modifier, ctype.type_name)


def _scalar_name(oid: int, typmod: int, type_name: str | None) -> str:
    entry = _SCALARS.get(oid)
    if entry is None:
        return type_name if type_name else f"type oid {oid}"
    name = entry[0]
    if oid == _NUMERIC_OID:
        ps = numeric_precision_scale(typmod)
        return name if ps is None else f"{name}({ps[0]},{ps[1]})"
    if oid in (1042, 1043) and typmod >= _VARHDRSZ:  # bpchar(n), varchar(n)
        return f"{name}({typmod - _VARHDRSZ})"
    if oid in (1083, 1114, 1184, 1266) and typmod >= 0:  # time(p), timestamp(p), ...
        return f"{name}({typmod})"
    return name


def relation_columns(
    relation: Relation, type_names: Mapping[int, str] | None = None
) -> tuple[tuple[str, PgColumnType], ...]:
    """The (name, type) pairs of a RELATION message, in column order.

    ``type_names`` maps user type OIDs to the names their Type messages carried.
    """
    names = type_names or {}
    return tuple(
        (c.name, PgColumnType(c.type_oid, c.type_modifier, names.get(c.type_oid)))
        for c in relation.columns
    )


def columns_as_text(relation: Relation, names: Collection[str]) -> Relation:
    """``relation`` with the columns ``names`` described as text (see ARRAYS OF MORE
    THAN ONE DIMENSION)."""
    if not names:
        return relation
    columns = tuple(
        dataclasses.replace(c, type_oid=TEXT_OID, type_modifier=-1) if c.name in names else c
        for c in relation.columns
    )
    return dataclasses.replace(relation, columns=columns)
