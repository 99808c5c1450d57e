"""Row keys compare as PostgreSQL's equality does (plan/keys.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkapply.plan.keys import canonical_keys, comparable
from sparkapply.plan.partition import key_hash


@pytest.mark.parametrize("t", [pa.float32(), pa.float64()])
def test_float_keys_equal_as_in_postgresql(t: pa.DataType) -> None:
    """-0 = 0 and NaN = NaN (whatever its payload) in PostgreSQL: the same key for
    matching, for the one-binary-per-row form and for the key hash."""
    stored = pa.array([-0.0, float("nan"), 1.5, None], t)
    named = pa.array([0.0, -float("nan"), 1.5, 2.0], t)
    assert pc.is_in(comparable(stored), value_set=comparable(named)).to_pylist() == [
        True,
        True,
        True,
        False,
    ]
    a, b = canonical_keys([stored]).to_pylist(), canonical_keys([named]).to_pylist()
    assert a[:3] == b[:3] and a[3] != b[3]
    assert list(key_hash([stored[:3]])) == list(key_hash([named[:3]]))
    # Distinct keys stay distinct.
    assert len(set(canonical_keys([pa.array([0.0, 1.0, -1.0, float("inf")], t)]).to_pylist())) == 4


def test_other_keys_are_unchanged() -> None:
    ints = pa.array([1, 2, None])
    assert comparable(ints) is ints
