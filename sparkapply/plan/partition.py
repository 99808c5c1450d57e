"""The key partitions of a table's batch: which task folds which key. Pure: key
values in, an owner per key out, no I/O.

MANY TASKS PER TABLE
    A big table's batch is folded by several tasks, each owning the keys whose hash
    falls in its partition. Events on different keys are independent, except where
    an UPDATE moves a row from one key to another: the keys it links are nodes of a
    graph whose edges are those updates (the *rename graph*, networkx), and every key
    of a connected component goes to the partition of the component's smallest key,
    so a chain of renames is folded by one task. Every task decodes the whole batch
    and computes the same graph and the same partitions (it is deterministic), so no
    second job and no shuffle is needed; each writes the rows and position deletes of
    its own keys, and the driver commits all of them as one snapshot.

    The driver decides how many partitions a table gets; the keys are only known
    once a task has decoded the batch, so each task calls :func:`owned` on its
    executor with the keys it decoded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from sparkapply.plan.keys import canonical_keys

# Key renames: (old key columns, new key columns), row by row, of the updates that
# change a key.
Renames = Sequence[tuple[Sequence[pa.Array], Sequence[pa.Array]]]


def key_hash(keys: Sequence[pa.Array]) -> np.ndarray:
    """A deterministic hash of each row's key (same value, same hash, in any process):
    for one integer column without nulls (the usual key), a mix of the value's bits;
    otherwise a polynomial over the bytes of its canonical encoding."""
    if len(keys) == 1 and pa.types.is_integer(keys[0].type) and keys[0].null_count == 0:
        col = keys[0]
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        x = col.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
        # splitmix64's finalizer: 1,000,000 keys in milliseconds, not in half a second
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
        mixed: np.ndarray = (x >> np.uint64(1)).astype(np.int64)
        return mixed
    canon = canonical_keys(keys)
    if isinstance(canon, pa.ChunkedArray):
        canon = canon.combine_chunks()
    canon = canon.cast(pa.large_binary())
    n = len(canon)
    offsets = np.frombuffer(canon.buffers()[1], np.int64, n + 1, canon.offset * 8)
    buf = canon.buffers()[2]
    data = np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    data = data[offsets[0] : offsets[-1]]
    owner = np.repeat(np.arange(n), lengths)
    pos = np.arange(len(data)) - np.repeat(offsets[:-1] - offsets[0], lengths)
    weights = (data.astype(np.int64) + 1) * ((pos * 7919 + 104729) % 1000003)
    sums = np.bincount(owner, weights=weights.astype(np.float64), minlength=n)
    return sums.astype(np.int64) * 2654435761 % 4294967311 + lengths


def owned(keys: Sequence[pa.Array], renames: Renames, partition: tuple[int, int]) -> np.ndarray:
    """Which rows of ``keys`` (key columns) partition ``index`` of ``count`` owns:
    the key's hash bucket, or its rename component's (see MANY TASKS PER TABLE)."""
    index, count = partition
    buckets = key_hash(keys) % count
    if renames:
        home = rename_homes(renames, count)
        for i, key in enumerate(canonical_keys(keys).to_pylist()):
            moved_to = home.get(key)
            if moved_to is not None:
                buckets[i] = moved_to
    mine: np.ndarray = buckets == index
    return mine


def rename_homes(renames: Renames, count: int) -> dict[bytes, int]:
    """The rename graph's keys (canonical) and the bucket of each: the bucket of the
    smallest key of its connected component."""
    import networkx as nx

    graph = nx.Graph()
    for old, new in renames:
        old_c = canonical_keys(old).to_pylist()
        new_c = canonical_keys(new).to_pylist()
        graph.add_edges_from(zip(old_c, new_c, strict=True))
    home: dict[bytes, int] = {}
    for component in nx.connected_components(graph):
        first = min(component)
        bucket = int(key_hash([pa.array([first], pa.binary())])[0] % count)
        for key in component:
            home[key] = bucket
    return home
