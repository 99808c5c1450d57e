"""Row keys compare as PostgreSQL's equality does (plan/keys.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sparkapply.plan.keys import ascending, canonical_keys, comparable
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


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_ascending_sorts_only_what_is_not_sorted(dtype: type) -> None:
    """An array already in order is returned as it is, not copied (NumPy's sort does
    not notice order); any other is sorted, repeats and all."""
    rng = np.random.default_rng(11)
    values: np.ndarray
    for values in (
        np.zeros(0, dtype),
        np.array([5], dtype),
        np.array([1, 1, 2, 7, 7, 9], dtype),
        np.sort(rng.integers(-(10**6), 10**6, 5000)).astype(dtype),
    ):
        assert ascending(values) is values
    for values in (
        np.array([2, 1], dtype),
        np.array([1, 3, 3, 2, 9], dtype),
        rng.integers(-(10**6), 10**6, 5000).astype(dtype),
    ):
        out = ascending(values)
        assert out is not values
        assert out.tolist() == sorted(values.tolist())
