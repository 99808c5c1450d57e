"""Reading pgoutput fields: the negotiation rules, the message names, field layouts
that report the exact field a short message cuts off, and fast constructors."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import fields
from types import MemberDescriptorType
from typing import Any, Literal, TypeVar

from sparkapply.errors import ProtocolError
from sparkapply.pgoutput.messages import (
    ColumnValue,
    Delete,
    Insert,
    TupleData,
    Update,
)

Buffer = bytes | memoryview
Streaming = Literal["off", "on", "parallel"]
_T = TypeVar("_T")

# Message names, as errors and the documentation spell them.
_NAMES: dict[int, str] = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}

_STREAM_TAGS = frozenset(map(ord, "SEcA"))  # protocol 2 + streaming
_TWO_PHASE_TAGS = frozenset(map(ord, "bPKr"))  # protocol 3
_STREAM_PREPARE_TAG = ord("p")  # protocol 3 + streaming
_REPLICA_IDENTITIES = frozenset(b"dnfi")


_NUL = re.compile(b"\x00")

_U32 = struct.Struct(">I").unpack_from
_I32 = struct.Struct(">i").unpack_from
_INSERT_HEAD = struct.Struct(">IBH").unpack_from  # relation id, 'N', column count
_STREAMED_INSERT_HEAD = struct.Struct(">IIBH").unpack_from  # xid first


# ---------------------------------------------------------------------------------
# Negotiation (shared with the encoder)


def _normalize_streaming(streaming: str | bool) -> Streaming:
    if streaming is True:
        return "on"
    if streaming is False:
        return "off"
    if streaming == "off":
        return "off"
    if streaming == "on":
        return "on"
    if streaming == "parallel":
        return "parallel"
    raise ValueError(f"streaming must be 'off', 'on', 'parallel' or a bool, not {streaming!r}")


def _check_proto_version(proto_version: int) -> None:
    if type(proto_version) is not int or not 1 <= proto_version <= 4:
        raise ValueError(f"proto_version must be 1, 2, 3 or 4, not {proto_version!r}")


def _stream_negotiated(proto_version: int, streaming: Streaming) -> bool:
    return proto_version >= 2 and streaming != "off"


def _abort_info_negotiated(proto_version: int, streaming: Streaming) -> bool:
    return proto_version >= 4 and streaming == "parallel"


def _negotiated(tag: int, proto_version: int, streaming: Streaming) -> bool:
    """Whether a message with this tag can arrive under this negotiation."""
    if tag in _STREAM_TAGS:
        return _stream_negotiated(proto_version, streaming)
    if tag in _TWO_PHASE_TAGS:
        return proto_version >= 3
    if tag == _STREAM_PREPARE_TAG:
        return proto_version >= 3 and _stream_negotiated(proto_version, streaming)
    return tag in _NAMES


def _requirement(tag: int) -> str:
    if tag in _STREAM_TAGS:
        return "protocol >= 2 with streaming"
    if tag == _STREAM_PREPARE_TAG:
        return "protocol >= 3 with streaming"
    return "protocol >= 3"


# ---------------------------------------------------------------------------------
# Errors


def tag_name(byte: int) -> str:
    """A message tag for errors: the character if printable, else its hex code."""
    return chr(byte) if 0x21 <= byte <= 0x7E else f"0x{byte:02x}"


def _bytes(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"


def _error(buf: Buffer, message: str, offset: int) -> ProtocolError:
    return ProtocolError(message, tag=tag_name(buf[0]), offset=offset)


def _name(buf: Buffer) -> str:
    return _NAMES.get(buf[0], "message")


class _Fields:
    """A run of fixed-width fields read with one ``unpack_from``.

    Knows each field's name and offset, so a short buffer is reported as the exact
    field that is cut off instead of struct.error.
    """

    __slots__ = ("_layout", "size", "unpack_from")

    def __init__(self, *fields: tuple[str, str]) -> None:
        st = struct.Struct(">" + "".join(code for _, code in fields))
        self.unpack_from = st.unpack_from
        self.size = st.size
        layout = []
        offset = 0
        for name, code in fields:
            width = struct.calcsize(">" + code)
            layout.append((name, offset, width))
            offset += width
        self._layout = tuple(layout)

    def read(self, buf: Buffer, o: int, where: str = "") -> tuple[Any, ...]:
        try:
            return self.unpack_from(buf, o)
        except struct.error:
            raise self.truncated(buf, o, where) from None

    def truncated(self, buf: Buffer, o: int, where: str = "") -> ProtocolError:
        end = len(buf)
        for name, offset, width in self._layout:
            at = o + offset
            if at + width > end:
                field = f"{where} {name}" if where else name
                left = max(end - at, 0)
                return _error(
                    buf,
                    f"truncated {_name(buf)} message: {field} needs {_bytes(width)}"
                    f" at offset {at}, {left} left",
                    at,
                )
        return _error(buf, f"truncated {_name(buf)} message", o)  # pragma: no cover


def _read_string(buf: Buffer, o: int, field: str) -> tuple[str, int]:
    m = _NUL.search(buf, o)
    if m is None:
        raise _error(buf, f"missing NUL terminator for {_name(buf)} {field}", o)
    nul = m.start()
    try:
        return str(buf[o:nul], "utf-8"), nul + 1
    except UnicodeDecodeError as e:
        raise _error(
            buf, f"invalid UTF-8 in {_name(buf)} {field}: {e.reason}", o + e.start
        ) from None


def _expect_end(buf: Buffer, o: int) -> None:
    extra = len(buf) - o
    if extra:
        raise _error(buf, f"{extra} trailing bytes after {_name(buf)} message", o)


def _expect_zero_flags(buf: Buffer, flags: int, o: int) -> None:
    if flags:
        raise _error(buf, f"unrecognized flags {flags} in {_name(buf)} message (must be 0)", o)


_XID = _Fields(("xid", "I"))


def _stream_prefix(streamed: bool, buf: Buffer) -> tuple[int | None, int]:
    """The xid that prefixes a message inside a stream block, and where the body starts."""
    if streamed:
        return _XID.read(buf, 1)[0], 5
    return None, 1


# ---------------------------------------------------------------------------------
# Fast construction of the hot message classes


def _fast_constructor(cls: type[_T], *names: str) -> Callable[..., _T]:
    """A positional constructor for the frozen slots dataclass ``cls``, skipping __init__.

    Frozen __init__ sets each field through object.__setattr__; setting the slot
    descriptors directly builds an equal object in about two thirds of the time.
    ``names`` are the fields the caller passes, in order. If the class is not exactly
    that (a field added or renamed in messages.py, a __post_init__, no slots), the
    class itself is returned: a change there can make decoding slower, never wrong.
    """
    descriptors = [cls.__dict__.get(n) for n in names]
    if (
        # cls is a dataclass by contract; TypeVar _T cannot say so to mypy.
        tuple(f.name for f in fields(cls)) != names  # type: ignore[arg-type]
        or hasattr(cls, "__post_init__")
        or not all(isinstance(d, MemberDescriptorType) for d in descriptors)
    ):
        return cls
    setters = [d.__set__ for d in descriptors]  # type: ignore[union-attr]  # checked above
    return _setting_constructor(cls, setters)


def _setting_constructor(
    cls: type[_T], setters: list[Callable[[Any, Any], None]]
) -> Callable[..., _T]:
    """``make(a0, a1, ...)``: a new ``cls`` with each setter applied to its argument.

    The body is written out for the arity, as dataclasses writes ``__init__``: a loop
    over the setters would cost most of what skipping ``__init__`` saves. The setters
    are closure cells of ``make``, as in a hand-written one.
    """
    args = [f"a{i}" for i in range(len(setters))]
    cells = [f"s{i}" for i in range(len(setters))]
    sets = "".join(f"        {s}(o, {a})\n" for s, a in zip(cells, args, strict=True))
    source = (
        f"def factory(new, cls, {', '.join(cells)}):\n"
        f"    def make({', '.join(args)}):\n"
        "        o = new(cls)\n"
        f"{sets}"
        "        return o\n"
        "    return make\n"
    )
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    make: Callable[..., _T] = namespace["factory"](object.__new__, cls, *setters)
    return make


_new_tupledata: Callable[[bytes, tuple[ColumnValue, ...]], TupleData] = _fast_constructor(
    TupleData, "kinds", "values"
)
_new_insert: Callable[[int | None, int, TupleData], Insert] = _fast_constructor(
    Insert, "xid", "relation_id", "new"
)
_new_update: Callable[[int | None, int, str | None, TupleData | None, TupleData], Update] = (
    _fast_constructor(Update, "xid", "relation_id", "old_kind", "old", "new")
)
_new_delete: Callable[[int | None, int, str, TupleData], Delete] = _fast_constructor(
    Delete, "xid", "relation_id", "old_kind", "old"
)
