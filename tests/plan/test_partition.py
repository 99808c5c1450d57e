"""The key partitions: a deterministic hash, and chains of renames kept in one task."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkapply.plan.partition import key_hash, owned


def test_key_hash_is_deterministic_and_spreads() -> None:
    keys = pa.array(range(10_000), pa.int64())
    a = key_hash([keys]) % 4
    b = key_hash([pa.array(list(range(10_000)), pa.int64())]) % 4
    assert (a == b).all()
    counts = np.bincount(a, minlength=4)
    assert counts.min() > 2000, counts
    strings = key_hash([pa.array(["", "a", "b", "ab", "ba"], pa.string())])
    assert len(set(strings.tolist())) == 5
    # Integer keys take the bit-mixing path: chunked or not, any width, never negative.
    chunked = pa.chunked_array([keys.slice(0, 3_000), keys.slice(3_000)])
    assert (key_hash([chunked]) % 4 == a).all()
    assert (key_hash([keys.cast(pa.int32())]) % 4 == a).all()
    assert (key_hash([pa.array([-(2**63), -1, 0, 2**63 - 1], pa.int64())]) >= 0).all()
    # ... and with a null, the canonical path.
    assert len(key_hash([pa.array([1, None, 2], pa.int64())])) == 3


def test_every_key_has_one_owner_and_renames_stay_together() -> None:
    keys = [pa.array(range(100), pa.int64())]
    # 3 → 50 → 97 and 10 → 11: two chains of renames
    renames = [
        ([pa.array([3, 50], pa.int64())], [pa.array([50, 97], pa.int64())]),
        ([pa.array([10], pa.int64())], [pa.array([11], pa.int64())]),
    ]
    masks = [owned(keys, renames, (i, 4)) for i in range(4)]
    assert (np.sum(masks, axis=0) == 1).all()
    owner = np.argmax(masks, axis=0)
    assert owner[3] == owner[50] == owner[97]
    assert owner[10] == owner[11]
    # without renames, the owner is the hash bucket
    plain = [owned(keys, [], (i, 4)) for i in range(4)]
    assert (np.argmax(plain, axis=0) == key_hash(keys) % 4).all()
