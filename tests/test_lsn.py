"""The LSN value type."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkapply.errors import ApplyError
from sparkapply.lsn import Lsn


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_text_round_trip(value: int) -> None:
    lsn = Lsn(value)
    assert Lsn.parse(str(lsn)) == value


def test_format_and_parse() -> None:
    assert str(Lsn.parse("16/B374D848")) == "16/B374D848"
    assert Lsn.parse("0/0") == 0
    with pytest.raises(ValueError, match="not an LSN"):
        Lsn.parse("16-B374")
    with pytest.raises(ValueError, match="out of range"):
        Lsn(-1)


def test_errors_pickle_with_context_and_render_lsn() -> None:
    err = ApplyError("boom", xid=7, lsn=Lsn.parse("1/10"), relation="public.t", hint="do x")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ApplyError
    assert str(back) == "boom (xid 7, lsn 1/10, relation public.t)\nHINT: do x"
