"""The lanes: per-table chains in commit order, checked against the dependency graph
they are the chains of (built here with networkx, as an oracle)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import networkx as nx

from sparkapply.changes.transaction import CommittedTxn
from sparkapply.lsn import Lsn
from sparkapply.plan.lanes import lanes


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


def dependency_graph(
    txns: Sequence[CommittedTxn], table_of: Callable[[int], str | None]
) -> nx.DiGraph:
    """Edges ``i → j`` when transaction ``j`` is the next after ``i`` on a table."""
    graph = nx.DiGraph()
    last_on_table: dict[str, int] = {}
    for ordinal, t in enumerate(txns):
        graph.add_node(ordinal, xid=t.xid, lsn=int(t.commit_lsn))
        tables = {name for rid in t.relation_ids if (name := table_of(rid)) is not None}
        for table in sorted(tables):
            prev = last_on_table.get(table)
            if prev is not None:
                graph.add_edge(prev, ordinal, table=table)
            last_on_table[table] = ordinal
            graph.nodes[ordinal].setdefault("tables", set()).add(table)
    return graph


def table_lanes(graph: nx.DiGraph) -> dict[str, list[int]]:
    """Per table, its transactions in commit order (a topological order of its chain)."""
    out: dict[str, list[int]] = {}
    for ordinal in nx.topological_sort(graph):
        for table in sorted(graph.nodes[ordinal].get("tables", ())):
            out.setdefault(table, []).append(ordinal)
    for chain in out.values():
        chain.sort()
    return out


NAMES = {1: "s.a", 2: "s.b", 3: "s.c", 4: "s.a"}  # relids 1 and 4: same table (recreated)


def test_chains_per_table() -> None:
    batch = [txn(10, 100, 1), txn(11, 110, 2), txn(12, 120, 1, 2), txn(13, 130, 3), txn(14, 140, 4)]
    g = dependency_graph(batch, NAMES.get)
    assert sorted(g.edges) == [(0, 2), (1, 2), (2, 4)]
    assert lanes(batch, NAMES.get) == {"s.a": [0, 2, 4], "s.b": [1, 2], "s.c": [3]}
    assert table_lanes(g) == lanes(batch, NAMES.get)


def test_unknown_relations_are_ignored() -> None:
    assert lanes([txn(1, 1, 99)], NAMES.get) == {}


def test_lanes_equal_the_graph_lanes() -> None:
    rnd = random.Random(7)
    for _ in range(50):
        batch = [
            txn(100 + i, 1000 + i, *rnd.sample([1, 2, 3, 4, 99], rnd.randint(0, 3)))
            for i in range(rnd.randint(0, 30))
        ]
        assert lanes(batch, NAMES.get) == table_lanes(dependency_graph(batch, NAMES.get))
