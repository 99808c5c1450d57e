"""Values of every mapped type (README, "Type mapping") for verify's tests: the special
ones of each (NaN, infinities, -0, BC dates, the clamp bounds, empty arrays, null
elements, unicode, ...) as PostgreSQL input text, and hypothesis strategies for
ordinary ones.

A column is ``(name, declared type, specials)``; :func:`rows` spreads each column's
specials and a null over a table's rows, shifted by the column's position, so that
every value and the null meet every other column's values in some row."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Literal

from hypothesis import strategies as st

Column = tuple[str, str, tuple[str, ...]]

TYPES_SQL = (
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)",
)

_BIG = "x" * 3 + "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(3000))  # TOASTed

COLUMNS: tuple[Column, ...] = (
    ("i2", "int2", ("-32768", "32767", "0")),
    ("i4", "int4", ("-2147483648", "2147483647", "0")),
    ("i8", "int8", ("-9223372036854775808", "9223372036854775807", "-1")),
    ("o", "oid", ("0", "4294967295")),
    (
        "f4",
        "float4",
        ("NaN", "Infinity", "-Infinity", "-0", "0", "3.4028235e38", "1e-45", "-1.17549435e-38"),
    ),
    (
        "f8",
        "float8",
        ("NaN", "Infinity", "-Infinity", "-0", "1.7976931348623157e308", "5e-324", "0.1"),
    ),
    ("n10", "numeric(10,2)", ("NaN", "0", "-0.01", "99999999.99", "-99999999.99", "1.5")),
    ("n38", "numeric(38,10)", ("0.0000000001", "-9999999999999999999999999999.9999999999")),
    (
        "nu",
        "numeric",
        ("NaN", "Infinity", "-Infinity", "1e-20", "-0", "1e100", "0.000", "1.500"),
    ),
    ("n40", "numeric(40,5)", ("NaN", "12345678901234567890123456789012345.12345", "-1")),
    ("bo", "bool", ("t", "f")),
    ("tx", "text", ("", "ünïcode ✓ 😀", "a\x1fb\x1ec\x1dd", "NULL", _BIG)),
    ("vc", "varchar(8)", ("", "abcdefgh", "ü")),
    ("bc", "char(5)", ("", "ab", "abcde")),
    ("nm", "name", ("x", "")),
    ("by", "bytea", ("\\x", "\\x00ff10", "\\x1e1f")),
    (
        "d",
        "date",
        (
            "infinity",
            "-infinity",
            "4713-01-01 BC",
            "0001-01-01",
            "0001-12-31 BC",
            "9999-12-31",
            "10000-01-01",
            "1970-01-01",
        ),
    ),
    ("tm", "time", ("00:00:00", "24:00:00", "23:59:59.999999", "12:34:56.789")),
    (
        "ts",
        "timestamp",
        (
            "infinity",
            "-infinity",
            "0001-01-01 00:00:00",
            "9999-12-31 23:59:59.999999",
            "4713-01-01 00:00:00 BC",
            "294276-12-31 23:59:59",
            "1969-12-31 23:59:59.999999",
        ),
    ),
    (
        "tz",
        "timestamptz",
        (
            "infinity",
            "-infinity",
            "0001-01-01 00:00:00+00",
            "0001-01-01 00:00:00+14",
            "9999-12-31 23:59:59.999999+00",
            "1850-06-01 12:00:00+05:53:28",
            "2026-11-28 06:00:00.5-08",
        ),
    ),
    (
        "u",
        "uuid",
        (
            "00000000-0000-0000-0000-000000000000",
            "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        ),
    ),
    ("js", "json", ('{"a":  1}', "[]", "null", '"ü"')),
    ("jb", "jsonb", ('{"b": [1, 2.50, true], "a": null}', "null", "{}")),
    ("iv", "interval", ("1 day 02:00", "-3 mons", "00:00:00", "178000000 years")),
    ("ip", "inet", ("192.168.0.1/24", "::1")),
    ("mo", "money", ("-12.34", "0")),
    ("tt", "timetz", ("10:00:00+02", "24:00:00-14")),
    ("en", "mood", ("sad", "happy")),
    ("dm", "posint", ("1", "2147483647")),
    ("ai", "int4[]", ("{}", "{NULL}", "{1,NULL}", "{NULL,2}", "[0:1]={5,6}", "{-2147483648}")),
    ("at", "text[]", ("{}", "{NULL}", '{"",NULL,"a b"}', '{"NULL"}', '{"ü,\\"q\\"",x}')),
    ("af", "float8[]", ("{NaN,Infinity,-Infinity,-0,NULL}", "{}")),
    ("an", "numeric(6,2)[]", ("{NaN,NULL,1.5}", "{}")),
    ("anu", "numeric[]", ("{NaN,Infinity,NULL,1.500}",)),
    ("ab", "bool[]", ("{t,NULL,f}",)),
    ("aby", "bytea[]", ('{"\\\\x00ff",NULL}', '{"\\\\x"}')),
    ("ad", "date[]", ('{infinity,-infinity,NULL,"4713-01-01 BC",2026-01-02}', "{NULL}")),
    ("atm", "time[]", ("{24:00:00,NULL}",)),
    (
        "ats",
        "timestamp[]",
        ('{NULL,infinity,"2026-01-02 03:04:05",-infinity}', "{NULL}", "{}"),
    ),
    ("atz", "timestamptz[]", ('{NULL,"0001-01-01 00:00:00+14",infinity}',)),
    ("au", "uuid[]", ("{NULL,a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",)),
    ("ac", "char(2)[]", ('{"a ",b,NULL}',)),
    ("ajb", "jsonb[]", ('{"{\\"a\\": 1}",NULL}',)),
    ("aen", "mood[]", ("{sad,NULL}", "{}")),
    ("m2", "int4[][]", ("{{1,2},{3,NULL}}", "{}", "{1,2}", "{{NULL}}")),
    ("mt", "text[][]", ('{{a,b},{NULL,""}}',)),
)


def rows(columns: Sequence[Column], count: int | None = None) -> list[list[str | None]]:
    """Rows over ``columns``: enough that each column holds each of its specials and a
    null (``count``: at least that many)."""
    pools = [(None, *specials) for _, _, specials in columns]
    n = max([len(p) for p in pools] + [count or 0])
    return [[pool[(r + c) % len(pool)] for c, pool in enumerate(pools)] for r in range(n)]


# -- ordinary values, as PostgreSQL input text --------------------------------------------


def _float_text(f: float) -> str:
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return repr(f)


def _floats(width: Literal[32, 64]) -> st.SearchStrategy[str]:
    return st.floats(width=width).map(_float_text)


def _decimal_text(units: int, places: int) -> str:
    """``units`` ten-to-the-``places``ths, exactly (no decimal context rounds it)."""
    digits = str(abs(units)).rjust(places + 1, "0")
    sign = "-" if units < 0 else ""
    return (
        f"{sign}{digits[: len(digits) - places]}.{digits[len(digits) - places :]}"
        if places
        else f"{sign}{digits}"
    )


def _decimals(digits: int, places: int) -> st.SearchStrategy[str]:
    most = 10**digits - 1
    return st.integers(-most, most).map(lambda units: _decimal_text(units, places))


_TEXT = st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=20)
_DATES = st.dates().map(lambda d: d.isoformat())
_TIMESTAMPS = st.datetimes().map(lambda t: t.isoformat(" "))
_ZONES = st.sampled_from(["+00", "-08", "+05:30", "+14", "-12:15"])

ORDINARY: dict[str, st.SearchStrategy[str]] = {
    "int2": st.integers(-(2**15), 2**15 - 1).map(str),
    "int4": st.integers(-(2**31), 2**31 - 1).map(str),
    "int8": st.integers(-(2**63), 2**63 - 1).map(str),
    "oid": st.integers(0, 2**32 - 1).map(str),
    "float4": _floats(32),
    "float8": _floats(64),
    "numeric(10,2)": _decimals(10, 2),
    "numeric(38,10)": _decimals(38, 10),
    "numeric": _decimals(30, 0) | _decimals(40, 20),
    "bool": st.sampled_from(["t", "f"]),
    "text": _TEXT,
    "varchar(8)": st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=8),
    "char(5)": st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=5),
    "bytea": st.binary(max_size=20).map(lambda b: "\\x" + b.hex()),
    "date": _DATES,
    "time": st.times().map(lambda t: t.isoformat()),
    "timestamp": _TIMESTAMPS,
    "timestamptz": st.tuples(_TIMESTAMPS, _ZONES).map(lambda p: p[0] + p[1]),
    "uuid": st.uuids().map(str),
    "jsonb": st.recursive(
        st.none() | st.booleans() | st.integers() | _TEXT,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
        max_leaves=6,
    ).map(json.dumps),
}


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def array_of(element: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A one-dimensional array literal of ``element`` values, null elements among them."""
    return st.lists(st.none() | element, max_size=5).map(
        lambda items: "{" + ",".join("NULL" if e is None else _quoted(e) for e in items) + "}"
    )


def values_of(pg_type: str, specials: Sequence[str]) -> st.SearchStrategy[str | None]:
    """A column's values: null, its specials, ordinary ones of its type."""
    options: list[st.SearchStrategy[str | None]] = [st.none(), st.sampled_from(list(specials))]
    ordinary = ORDINARY.get(pg_type)
    if ordinary is None and pg_type.endswith("[]") and not pg_type.endswith("[][]"):
        element = ORDINARY.get(pg_type[:-2])
        ordinary = array_of(element) if element is not None else None
    if ordinary is not None:
        options.append(ordinary)
    return st.one_of(options)
