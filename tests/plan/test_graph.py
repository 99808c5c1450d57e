"""The dependency graph: per-table chains in commit order."""

from __future__ import annotations

import random

from sparkapply.changes.transaction import CommittedTxn
from sparkapply.lsn import Lsn
from sparkapply.plan.graph import components, dependency_graph, lanes, table_lanes


def txn(xid: int, lsn: int, *relids: int) -> CommittedTxn:
    return CommittedTxn(
        xid=xid,
        commit_lsn=Lsn(lsn),
        end_lsn=Lsn(lsn + 1),
        commit_time=0,
        kind="commit",
        segments=(),
        relation_ids=frozenset(relids),
        relations={},
        relation_messages=(),
        n_changes=1,
    )


NAMES = {1: "s.a", 2: "s.b", 3: "s.c", 4: "s.a"}  # relids 1 and 4: same table (recreated)


def test_chains_per_table_and_independent_components() -> None:
    batch = [txn(10, 100, 1), txn(11, 110, 2), txn(12, 120, 1, 2), txn(13, 130, 3), txn(14, 140, 4)]
    g = dependency_graph(batch, NAMES.get)
    assert sorted(g.edges) == [(0, 2), (1, 2), (2, 4)]
    assert table_lanes(g) == {"s.a": [0, 2, 4], "s.b": [1, 2], "s.c": [3]}
    assert sorted(map(sorted, components(g))) == [[0, 1, 2, 4], [3]]


def test_unknown_relations_are_ignored() -> None:
    g = dependency_graph([txn(1, 1, 99)], NAMES.get)
    assert table_lanes(g) == {}


def test_lanes_equal_the_graph_lanes() -> None:
    rnd = random.Random(7)
    for _ in range(50):
        batch = [
            txn(100 + i, 1000 + i, *rnd.sample([1, 2, 3, 4, 99], rnd.randint(0, 3)))
            for i in range(rnd.randint(0, 30))
        ]
        assert lanes(batch, NAMES.get) == table_lanes(dependency_graph(batch, NAMES.get))
