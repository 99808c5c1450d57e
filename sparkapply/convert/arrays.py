"""PostgreSQL array literals split into their elements; runs inside Spark executors.

A column of literals becomes list offsets and one column of element texts, which the
element type's converter then converts as a whole. Literals without quotes, backslashes
and braces split with kernels; only the others are parsed one by one.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from sparkapply.convert.kernels import NULL_TEXT, all_true, any_true
from sparkapply.errors import UnrepresentableValueError

_DIMENSIONS = re.compile(r"((?:\[-?\d+:-?\d+\])+)=")
_UNESCAPE = re.compile(r"\\(.)", re.DOTALL)
_ELEMENT_RE: dict[str, re.Pattern[str]] = {}


def split_literals(text: pa.Array, delimiter: str) -> tuple[pa.Array, pa.Array]:
    """The list offsets (int64, one more than literals) and the element texts (large
    string, ``None`` for a NULL element) of a column of array literals."""
    split = _split_unquoted(text, delimiter)
    return split if split is not None else _split_each(text, delimiter)


def _split_unquoted(text: pa.Array, delimiter: str) -> tuple[pa.Array, pa.Array] | None:
    """Split with kernels when no literal needs the parser, else None.

    That is the common case for numbers, dates, uuids and booleans: array_out quotes
    an element only if it holds a quote, backslash, brace, the delimiter or
    whitespace, is empty or reads NULL; so a body without quotes, backslashes and
    braces splits exactly at the delimiter, and no element of it is empty.
    """
    filled = text.fill_null("{}") if text.null_count else text
    if not (all_true(pc.starts_with(filled, "{")) and all_true(pc.ends_with(filled, "}"))):
        return None  # bounds decoration ('[0:1]={5,6}') or not an array literal
    body = pc.utf8_slice_codeunits(filled, 1, -1)
    if any_true(pc.match_substring_regex(body, r'["{}\\]')):
        return None
    parts = pc.split_pattern(body, delimiter)
    empty = pc.equal(body, "")
    flat = pc.list_flatten(parts)
    blank = pc.equal(flat, "")
    # '{}' splits to one empty string; any other empty piece means a malformed literal.
    if pc.sum(blank).as_py() != pc.sum(empty).as_py():
        return None
    counts = pc.if_else(empty, 0, pc.list_value_length(parts).cast(pa.int64()))
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(counts)])
    kept = flat.filter(pc.invert(blank)).cast(pa.large_string())
    return offsets, pc.if_else(pc.equal(kept, "NULL"), NULL_TEXT, kept)


def _split_each(text: pa.Array, delimiter: str) -> tuple[pa.Array, pa.Array]:
    offsets = [0]
    elements: list[str | None] = []
    for literal in text.to_pylist():
        if literal is not None:
            elements.extend(_parse_array(literal, delimiter))
        offsets.append(len(elements))
    return pa.array(offsets, pa.int64()), pa.array(elements, pa.large_string())


def _parse_array(literal: str, delimiter: str) -> list[str | None]:
    """The elements of a one-dimensional PostgreSQL array literal (array_out's form)."""
    if literal.startswith("["):
        # Bounds decoration, printed when a lower bound is not 1: '[0:1]={5,6}'.
        m = _DIMENSIONS.match(literal)
        if m is None:
            raise ValueError("malformed array dimensions")
        if m[1].count("[") > 1:
            raise _multidimensional()
        literal = literal[m.end() :]
    if len(literal) < 2 or literal[0] != "{" or literal[-1] != "}":
        raise ValueError("an array literal is enclosed in braces")
    body = literal[1:-1]
    if not body:
        return []
    if body[0] == "{":
        raise _multidimensional()
    if '"' not in body:
        # array_out quotes every element that holds a quote, backslash, brace,
        # delimiter or whitespace, is empty, or reads NULL; so this split is exact.
        if "{" in body or "}" in body or "\\" in body:
            raise ValueError("malformed array literal")
        parts = body.split(delimiter)
        if "" in parts:
            raise ValueError("malformed array literal")
        return [None if e == "NULL" else e for e in parts]
    return _parse_quoted(body, delimiter)


def _parse_quoted(body: str, delimiter: str) -> list[str | None]:
    rx = _ELEMENT_RE.get(delimiter)
    if rx is None:
        d = re.escape(delimiter)
        rx = _ELEMENT_RE[delimiter] = re.compile(
            rf'"((?:[^"\\]|\\.)*)"|([^"{{}}\\{d}]+)', re.DOTALL
        )
    out: list[str | None] = []
    pos, end = 0, len(body)
    while True:
        m = rx.match(body, pos)
        if m is None:
            raise ValueError("malformed array literal")
        quoted = m[1]
        if quoted is not None:
            out.append(_UNESCAPE.sub(r"\1", quoted) if "\\" in quoted else quoted)
        else:
            out.append(None if m[2] == "NULL" else m[2])
        pos = m.end()
        if pos == end:
            return out
        if body[pos] != delimiter:
            raise ValueError("malformed array literal")
        pos += 1


def _multidimensional() -> ValueError:
    return UnrepresentableValueError(
        "a multi-dimensional array in a column mirrored as a list: an Iceberg list has "
        "one nesting depth, and the column was declared with one dimension (or none)",
        hint="declare its dimensions on the publisher (ALTER TABLE ... ALTER COLUMN ... "
        "TYPE int4[][], say; nothing is rewritten), then stop sparkapply and run "
        "`sparkapply resync schema.table`: a column declared with more than one "
        "dimension is mirrored as the array's text",
    )
