"""The error classes added to the one tree: picklable, classified, still ValueErrors
where callers expect one."""

from __future__ import annotations

import pickle

import pytest

from sparkapply.errors import (
    ConversionError,
    ErrorKind,
    LocationError,
    SinkArgumentError,
    SinkError,
    SparkapplyError,
    UnrepresentableValueError,
)


@pytest.mark.parametrize(
    ("error", "bases", "kind"),
    [
        (
            UnrepresentableValueError("x", hint="h", column="c"),
            (ConversionError, ValueError),
            ErrorKind.OPERATOR,
        ),
        (SinkArgumentError("y", table="t"), (SinkError, ValueError), ErrorKind.FATAL),
        (LocationError("z", hint="q"), (SinkError,), ErrorKind.OPERATOR),
    ],
)
def test_new_errors_are_picklable_and_classified(
    error: SparkapplyError, bases: tuple[type, ...], kind: ErrorKind
) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert back.context == error.context and back.hint == error.hint
    assert all(isinstance(back, b) for b in bases)
    assert back.kind is kind
