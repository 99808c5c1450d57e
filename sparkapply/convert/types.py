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
| multi-dimensional array, e.g. {{1,2},{3,4}}     | ConversionError (not supported)              |
| bytea in the escape output format               | the same bytes (decoded per value, slower)   |
| text that is not valid UTF-8                    | ConversionError                              |

Why clamp to 0001..9999: that is the range every reader of the tables (Spark, Trino,
DuckDB, pyiceberg/Python ``datetime``) represents, PostgreSQL's ``infinity`` is used as
"open end", and the edges keep that meaning in range comparisons. The clamp is
deterministic (the same input always gives the same value) and lossy only for values
that no mainstream reader could show anyway.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from sparkapply.errors import UnsupportedTypeError
from sparkapply.pgoutput.messages import Relation

# First OID not assigned by initdb; types at or above it are user-defined (enums,
# domains, composites, extension types such as citext) and arrive with a Type message.
FIRST_NORMAL_OID = 16384

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

_S = ColumnKind.STRING

# ---------------------------------------------------------------------------------
# THE OID TABLE: built-in base types (pg_type.dat, PostgreSQL 16), name and kind.
# Anything built-in that is not listed (pseudo-types, catalog row types) is text too.
# NUMERIC is listed as STRING; column_target() refines it by type modifier.
# ---------------------------------------------------------------------------------
_NUMERIC_OID = 1700
_BOX_OID = 603  # the one built-in type whose array delimiter is ';', not ','

_SCALARS: dict[int, tuple[str, ColumnKind]] = {
    16: ("bool", ColumnKind.BOOLEAN),
    17: ("bytea", ColumnKind.BINARY),
    18: ("char", _S),
    19: ("name", _S),
    20: ("int8", ColumnKind.LONG),
    21: ("int2", ColumnKind.INT),
    22: ("int2vector", _S),  # space-separated, not an array literal
    23: ("int4", ColumnKind.INT),
    24: ("regproc", _S),
    25: ("text", _S),
    26: ("oid", ColumnKind.LONG),  # unsigned 32-bit: needs a long
    27: ("tid", _S),
    28: ("xid", _S),
    29: ("cid", _S),
    30: ("oidvector", _S),  # space-separated, not an array literal
    114: ("json", _S),
    142: ("xml", _S),
    600: ("point", _S),
    601: ("lseg", _S),
    602: ("path", _S),
    603: ("box", _S),
    604: ("polygon", _S),
    628: ("line", _S),
    650: ("cidr", _S),
    700: ("float4", ColumnKind.FLOAT),
    701: ("float8", ColumnKind.DOUBLE),
    718: ("circle", _S),
    774: ("macaddr8", _S),
    790: ("money", _S),
    829: ("macaddr", _S),
    869: ("inet", _S),
    1033: ("aclitem", _S),
    1042: ("bpchar", _S),
    1043: ("varchar", _S),
    1082: ("date", ColumnKind.DATE),
    1083: ("time", ColumnKind.TIME),
    1114: ("timestamp", ColumnKind.TIMESTAMP),
    1184: ("timestamptz", ColumnKind.TIMESTAMPTZ),
    1186: ("interval", _S),
    1266: ("timetz", _S),
    1560: ("bit", _S),
    1562: ("varbit", _S),
    1700: ("numeric", _S),
    1790: ("refcursor", _S),
    2202: ("regprocedure", _S),
    2203: ("regoper", _S),
    2204: ("regoperator", _S),
    2205: ("regclass", _S),
    2206: ("regtype", _S),
    2950: ("uuid", ColumnKind.UUID),
    2970: ("txid_snapshot", _S),
    3220: ("pg_lsn", _S),
    3614: ("tsvector", _S),
    3615: ("tsquery", _S),
    3642: ("gtsvector", _S),
    3734: ("regconfig", _S),
    3769: ("regdictionary", _S),
    3802: ("jsonb", _S),
    3904: ("int4range", _S),
    3906: ("numrange", _S),
    3908: ("tsrange", _S),
    3910: ("tstzrange", _S),
    3912: ("daterange", _S),
    3926: ("int8range", _S),
    4072: ("jsonpath", _S),
    4089: ("regnamespace", _S),
    4096: ("regrole", _S),
    4191: ("regcollation", _S),
    4451: ("int4multirange", _S),
    4532: ("nummultirange", _S),
    4533: ("tsmultirange", _S),
    4534: ("tstzmultirange", _S),
    4535: ("datemultirange", _S),
    4536: ("int8multirange", _S),
    5038: ("pg_snapshot", _S),
    5069: ("xid8", _S),
}

# Array type OID -> element type OID, for the arrays of the base types above
# (pg_type.typarray). An array column's type modifier is its element's modifier.
_ARRAYS: dict[int, int] = {
    143: 142,  # _xml
    199: 114,  # _json
    271: 5069,  # _xid8
    629: 628,  # _line
    651: 650,  # _cidr
    719: 718,  # _circle
    775: 774,  # _macaddr8
    791: 790,  # _money
    1000: 16,  # _bool
    1001: 17,  # _bytea
    1002: 18,  # _char
    1003: 19,  # _name
    1005: 21,  # _int2
    1006: 22,  # _int2vector
    1007: 23,  # _int4
    1008: 24,  # _regproc
    1009: 25,  # _text
    1010: 27,  # _tid
    1011: 28,  # _xid
    1012: 29,  # _cid
    1013: 30,  # _oidvector
    1014: 1042,  # _bpchar
    1015: 1043,  # _varchar
    1016: 20,  # _int8
    1017: 600,  # _point
    1018: 601,  # _lseg
    1019: 602,  # _path
    1020: 603,  # _box
    1021: 700,  # _float4
    1022: 701,  # _float8
    1027: 604,  # _polygon
    1028: 26,  # _oid
    1034: 1033,  # _aclitem
    1040: 829,  # _macaddr
    1041: 869,  # _inet
    1115: 1114,  # _timestamp
    1182: 1082,  # _date
    1183: 1083,  # _time
    1185: 1184,  # _timestamptz
    1187: 1186,  # _interval
    1231: 1700,  # _numeric
    1270: 1266,  # _timetz
    1561: 1560,  # _bit
    1563: 1562,  # _varbit
    2201: 1790,  # _refcursor
    2207: 2202,  # _regprocedure
    2208: 2203,  # _regoper
    2209: 2204,  # _regoperator
    2210: 2205,  # _regclass
    2211: 2206,  # _regtype
    2949: 2970,  # _txid_snapshot
    2951: 2950,  # _uuid
    3221: 3220,  # _pg_lsn
    3643: 3614,  # _tsvector
    3644: 3642,  # _gtsvector
    3645: 3615,  # _tsquery
    3735: 3734,  # _regconfig
    3770: 3769,  # _regdictionary
    3807: 3802,  # _jsonb
    3905: 3904,  # _int4range
    3907: 3906,  # _numrange
    3909: 3908,  # _tsrange
    3911: 3910,  # _tstzrange
    3913: 3912,  # _daterange
    3927: 3926,  # _int8range
    4073: 4072,  # _jsonpath
    4090: 4089,  # _regnamespace
    4097: 4096,  # _regrole
    4192: 4191,  # _regcollation
    5039: 5038,  # _pg_snapshot
    6150: 4451,  # _int4multirange
    6151: 4532,  # _nummultirange
    6152: 4533,  # _tsmultirange
    6153: 4534,  # _tstzmultirange
    6155: 4535,  # _datemultirange
    6157: 4536,  # _int8multirange
}

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
