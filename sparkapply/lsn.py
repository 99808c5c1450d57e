"""The LSN value type: a 64-bit WAL position printed as PostgreSQL's ``X/Y``."""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import repeat

_LSN_RE = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")
_MAX = (1 << 64) - 1


class Lsn(int):
    """A WAL position. Compares and hashes as an int; prints as ``16/B374D848``."""

    __slots__ = ()

    def __new__(cls, value: int | str | Lsn) -> Lsn:
        if type(value) is int and 0 <= value <= _MAX:  # the receive loop's: 2 a transaction
            return int.__new__(cls, value)
        if isinstance(value, str):
            return cls.parse(value)
        if not 0 <= int(value) <= _MAX:
            raise ValueError(f"LSN out of range: {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        m = _LSN_RE.match(text)
        if m is None:
            raise ValueError(f"not an LSN (expected X/Y in hex): {text!r}")
        return super().__new__(cls, (int(m.group(1), 16) << 32) | int(m.group(2), 16))

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


INVALID_LSN = Lsn(0)


def lsns(values: Iterable[int]) -> list[Lsn]:
    """LSNs of values read from the wire (unsigned 64-bit, so in range): without
    :meth:`Lsn.__new__`'s checks, which the receive loop paid twice a transaction."""
    return list(map(int.__new__, repeat(Lsn), values))


def format_lsn(value: int | None) -> str:
    """``X/Y`` for an int LSN, ``-`` for None (used in error context)."""
    return "-" if value is None else str(Lsn(value))
