"""The dependency graph over a batch's transactions, and the lanes it yields.

Nodes are the batch's transactions (by ordinal, i.e. commit order) and the tables
they touch. A transaction depends on the previous transaction that touched the same
table, so each table's transactions form a chain that must be applied in commit
order, while chains of different tables are independent: each table is one lane,
folded by one Spark task and committed as one Iceberg snapshot. TRUNCATE and schema
changes stay inside their table's chain, at their position, which is where the fold
applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx

from sparkapply.changes.transaction import CommittedTxn


def dependency_graph(
    txns: Sequence[CommittedTxn], table_of: Callable[[int], str | None]
) -> nx.DiGraph:
    """Edges ``i → j`` when transaction ``j`` is the next after ``i`` on a table."""
    graph = nx.DiGraph()
    last_on_table: dict[str, int] = {}
    for ordinal, txn in enumerate(txns):
        graph.add_node(ordinal, xid=txn.xid, lsn=int(txn.commit_lsn))
        tables = {t for rid in txn.relation_ids if (t := table_of(rid)) is not None}
        for table in sorted(tables):
            prev = last_on_table.get(table)
            if prev is not None:
                graph.add_edge(prev, ordinal, table=table)
            last_on_table[table] = ordinal
            graph.nodes[ordinal].setdefault("tables", set()).add(table)
    return graph


def lanes(
    txns: Sequence[CommittedTxn], table_of: Callable[[int], str | None]
) -> dict[str, list[int]]:
    """``table_lanes(dependency_graph(txns, table_of))`` in one pass, without the graph:
    per table, the ordinals of the transactions that touch it, in commit order. (The
    graph of 20,000 one-row transactions cost the driver about 0.3 s a batch.)"""
    out: dict[str, list[int]] = {}
    for ordinal, txn in enumerate(txns):
        if len(txn.relation_ids) == 1:
            (rid,) = txn.relation_ids
            if (table := table_of(rid)) is not None:
                out.setdefault(table, []).append(ordinal)
            continue
        for table in {t for rid in txn.relation_ids if (t := table_of(rid)) is not None}:
            out.setdefault(table, []).append(ordinal)
    return out


def table_lanes(graph: nx.DiGraph) -> dict[str, list[int]]:
    """Per table, its transactions in commit order (a topological order of its chain)."""
    lanes: dict[str, list[int]] = {}
    for ordinal in nx.topological_sort(graph):
        for table in sorted(graph.nodes[ordinal].get("tables", ())):
            lanes.setdefault(table, []).append(ordinal)
    for chain in lanes.values():
        chain.sort()
    return lanes


def components(graph: nx.DiGraph) -> list[list[int]]:
    """Groups of transactions linked through shared tables (for reporting)."""
    return [sorted(c) for c in nx.weakly_connected_components(graph)]
