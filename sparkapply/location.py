"""Locations: where a table's files live, spelled one way, escaped once, at one boundary.

TWO SPELLINGS

An Iceberg *location* (a warehouse, a table location, a data file's path in a manifest)
is spelled as Iceberg engines spell it: ``file://`` + the absolute path for the local
file system, ``s3://bucket/key`` for an object store, and in both cases **not
percent-escaped**. pyiceberg builds table locations by string concatenation
(``{warehouse}/{namespace}/{table}``) and opens files with ``urlparse(location).path``
without unescaping; Java Iceberg and DuckDB's iceberg extension read the same
spelling. So a path with a space, brackets or non-ASCII characters is stored as it is,
and every list of files (manifests, removed files, orphan lists) compares those
strings: a file is spelled identically everywhere because every spelling comes from
:func:`from_path` / :func:`join` here.

A *URI* in the RFC 3986 sense is needed only where a parser decodes percent-escapes:
SQLAlchemy URLs (``sqlite:///…``, whose database part is unescaped). Those are built
by :func:`escape_path` at exactly that boundary, so nothing is escaped twice. File
systems are opened from the stored spelling by :mod:`sparkapply.storage`, which splits
an object-store location as pyiceberg does (``bucket/key``, unescaped).

WHAT CANNOT WORK

``#`` and ``?`` start a fragment and a query for every URL parser, pyiceberg's
included, so a local location holding them cannot be read back. :func:`check_local`
rejects such a warehouse up front; table names holding them (or ``/``, ``%``) get a
location segment with those characters replaced and a short hash of the name
(:func:`path_segment`), so two such names never share a directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from urllib.parse import quote

from sparkapply.errors import LocationError

FILE_SCHEME = "file"

# "s3://…", "sqlite:///…", "file:/…": a scheme of two or more letters (one letter is a
# Windows drive).
_SCHEME_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+):")
# Characters a local location cannot hold (URL parsers cut the path there).
_UNREADABLE = ("#", "?")
# Characters a table location's path segment must not hold: the above, the path
# separators, and "%" (some readers unescape it), and control characters.
_UNSAFE_SEGMENT_RE = re.compile(r"[/\\#?%\x00-\x1f\x7f]")

WORK_DIR_PLACEHOLDER = "{work_dir}"


def scheme(location: str) -> str:
    """The location's scheme (``file``, ``s3``, …); ``""`` for a plain path."""
    m = _SCHEME_RE.match(location)
    return m.group("scheme").lower() if m else ""


def local_path(location: str) -> str | None:
    """The file-system path of a local location (``/a``, ``a/b``, ``file:///a``,
    ``file:/a``, ``file://localhost/a``), unescaped as stored; None for other schemes."""
    s = scheme(location)
    if s == "":
        return location
    if s != FILE_SCHEME:
        return None
    rest = location[len(FILE_SCHEME) + 1 :]
    if rest.startswith("//"):
        rest = rest[2:]
        host, sep, path = rest.partition("/")
        if host not in ("", "localhost"):
            raise LocationError(
                f"a file location on another host is not supported: {location}",
                hint="use a path on this machine or storage every executor mounts",
            )
        return sep + path
    return rest


def is_local(location: str) -> bool:
    return scheme(location) in ("", FILE_SCHEME)


def from_path(path: str | os.PathLike[str]) -> str:
    """The Iceberg location of a local path: ``file://`` + its absolute path, unescaped."""
    return "file://" + os.path.abspath(os.fspath(path))


def normalize(location: str) -> str:
    """A local location (plain path or any ``file:`` spelling) as :func:`from_path`
    spells it; any other location unchanged."""
    path = local_path(location)
    return location if path is None else from_path(path)


def join(location: str, *names: str) -> str:
    """``location/name/…`` without doubled separators; the names are used as they are."""
    out = location.rstrip("/")
    for name in names:
        out += "/" + name.strip("/")
    return out


def check_local(location: str, *, what: str) -> None:
    """Raise :class:`LocationError` if a local ``location`` cannot be read back by
    Iceberg readers (it holds ``#`` or ``?``)."""
    path = local_path(location)
    if path is None:
        return
    bad = [c for c in _UNREADABLE if c in path]
    if bad:
        raise LocationError(
            f"{what} {path!r} contains {' and '.join(repr(c) for c in bad)}, which Iceberg "
            "readers take for the start of a URL fragment or query",
            hint=f"choose a {what} path without '#' or '?'",
        )


def path_segment(name: str) -> str:
    """``name`` as one path segment of a table location.

    Names that are safe (spaces, quotes, brackets, mixed case and non-ASCII are) are
    used as they are, as pyiceberg would. Others get each unsafe character replaced by
    ``_`` and ``-`` + 8 hex digits of the name's hash appended, so distinct names keep
    distinct directories.
    """
    if not _UNSAFE_SEGMENT_RE.search(name) and name not in ("", ".", ".."):
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return f"{_UNSAFE_SEGMENT_RE.sub('_', name)}-{digest}"


def escape_path(path: str) -> str:
    """``path`` percent-escaped for a URI whose parser unescapes it (pyarrow, SQLAlchemy)."""
    return quote(path, safe="/")


def expand_work_dir(value: str, work_dir: str | os.PathLike[str]) -> str:
    """``value`` with ``{work_dir}`` replaced by the absolute work dir, spelled for its
    context: escaped inside a URL that is not a file location (``sqlite:///{work_dir}/c.db``,
    whose parser unescapes it), as it is in a plain path or a ``file:`` location (the
    Iceberg spelling)."""
    if WORK_DIR_PLACEHOLDER not in value:
        return value
    wd = os.path.abspath(os.fspath(work_dir))
    if scheme(value) not in ("", FILE_SCHEME):
        wd = escape_path(wd)
    return value.replace(WORK_DIR_PLACEHOLDER, wd)
