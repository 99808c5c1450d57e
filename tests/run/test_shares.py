"""A batch's shares: joining the batch's transactions once for every table gives each
table the runs a pass over its own transactions gives (the oracle: one
:meth:`Runs.add_one` per transaction, as the planner did per table)."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from sparkapply.apply.fold.rowwise import Runs, TxnInput
from sparkapply.changes.spool import SpoolSegment
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import messages as m
from sparkapply.plan.batch import plan_batch, relation_versions
from sparkapply.run.shares import BatchShares, StagedShare, relations_of


def relation(relid: int, name: str, version: int = 0) -> m.Relation:
    cols = (m.RelationColumn(1, "id", 23, -1), m.RelationColumn(0, f"v{version}", 23, -1))
    return m.Relation(0, relid, "s", name, "d", cols)


def oracle(
    batch: list[CommittedTxn], ordinals: tuple[int, ...], relids: frozenset[int]
) -> tuple[TxnInput, ...]:
    runs = Runs()
    for o in ordinals:
        t = batch[o]
        runs.add_one(o, t.xid, int(t.commit_lsn), t.segments, relations_of(t, relids))
    return tuple(runs.inputs())


def random_batch(rng: random.Random, n: int) -> list[CommittedTxn]:
    """Transactions as the assembler makes them: most received whole, back to back in
    shared spool files, sharing one mapping of cache entries per set of relations
    (replaced when an entry changes); some streamed (several segments, or none)."""
    names = {1: "a", 2: "b", 3: "c", 4: "a"}  # relids 1 and 4: one table (recreated)
    current = {rid: relation(rid, name) for rid, name in names.items()}
    mappings: dict[frozenset[int], Mapping[int, m.Relation]] = {}
    path, pos = "/spool/0", 0
    # What transactions mutate (None: not known), shared by many, as the assembler does.
    mutated_sets = [frozenset(), frozenset({1}), frozenset({2, 3}), frozenset({4})]
    out = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.03:  # a RELATION message: a new cache entry, new mappings
            rid = rng.choice(list(names))
            current[rid] = relation(rid, names[rid], version=i)
            mappings.clear()
        if roll > 0.97:
            path, pos = f"/spool/{i}", 0  # the next shared file
        relids = frozenset(rng.sample(list(names), rng.randint(1, 3)))
        if rng.random() < 0.1:  # a mapping of equal entries, not the shared one
            rels: Mapping[int, m.Relation] = {r: current[r] for r in relids}
        else:
            rels = mappings.setdefault(relids, {r: current[r] for r in relids})
        size = rng.randint(40, 400)
        shape = rng.random()
        if shape < 0.05:
            segments: tuple[SpoolSegment, ...] = ()
        elif shape < 0.1:
            segments = (SpoolSegment(f"/stream/{i}", 0, 10), SpoolSegment(f"/stream/{i}", 20, 90))
        else:
            gap = 8 if rng.random() < 0.05 else 0  # a transaction another batch took
            segments = (SpoolSegment(path, pos + gap, pos + gap + size),)
            pos += gap + size
        out.append(
            CommittedTxn(
                xid=1000 + i,
                commit_lsn=Lsn(10_000 + 100 * i),
                end_lsn=Lsn(10_050 + 100 * i),
                commit_time=0,
                kind="commit",
                segments=segments,
                relation_ids=relids,
                relations=rels,
                relation_messages=(),
                n_changes=1,
                mutated_relation_ids=rng.choice(mutated_sets) if rng.random() < 0.2 else None,
            )
        )
    return out


@pytest.mark.parametrize("seed", range(40))
def test_every_table_gets_the_runs_of_a_pass_over_its_own_transactions(seed: int) -> None:
    rng = random.Random(seed)
    batch = random_batch(rng, rng.randint(1, 300))
    versions = relation_versions(batch, lambda r: ("s", r.name))
    held = Lsn(10_000 + 100 * rng.randint(-1, 20))  # a replay: some of it applied already
    plan = plan_batch(batch, versions, lambda ident: held if ident == ("s", "b") else Lsn(0))
    shares = BatchShares(batch)
    for tp in plan.tables:
        relids = tp.relation_ids
        lane = [o for o, t in enumerate(batch) if relids & t.relation_ids]
        held_here = held if tp.ident == ("s", "b") else Lsn(0)
        assert tp.ordinals == tuple(o for o in lane if batch[o].commit_lsn > held_here)
        assert tp.insert_only == all(
            batch[o].mutated_relation_ids is not None
            and not relids & (batch[o].mutated_relation_ids or frozenset())
            for o in tp.ordinals
        )
        want = oracle(batch, tp.ordinals, tp.relation_ids)
        got = shares.inputs(tp.ordinals, tp.relation_ids, StagedShare(tp.name), None)
        assert got == want, tp.name
        # Asked again (another table with the same transactions), the same.
        assert shares.inputs(tp.ordinals, tp.relation_ids, StagedShare(tp.name), None) == want


def test_tables_with_the_same_transactions_share_their_runs() -> None:
    """pgbench's shape: every transaction writes the same four tables, received whole,
    back to back: each table reads the batch as one run, of every transaction."""
    rels = {r: relation(r, name) for r, name in enumerate("wxyz", start=1)}
    relids = frozenset(rels)
    batch = [
        CommittedTxn(
            xid=i,
            commit_lsn=Lsn(100 + i),
            end_lsn=Lsn(100 + i),
            commit_time=0,
            kind="commit",
            segments=(SpoolSegment("/spool/0", 50 * i, 50 * i + 50),),
            relation_ids=relids,
            relations=rels,
            relation_messages=(),
            n_changes=4,
            mutated_relation_ids=frozenset({1, 2}),
        )
        for i in range(1000)
    ]
    plan = plan_batch(batch, relation_versions(batch, lambda r: ("s", r.name)), lambda _: Lsn(0))
    assert [(tp.name, tp.insert_only) for tp in plan.tables] == [
        ("s.w", False),
        ("s.x", False),
        ("s.y", True),
        ("s.z", True),
    ]
    shares = BatchShares(batch)
    for tp in plan.tables:
        (run,) = shares.inputs(tp.ordinals, tp.relation_ids, StagedShare(tp.name), None)
        assert run.members == 1000
        assert run.segments == (SpoolSegment("/spool/0", 0, 50_000),)
        (relid,) = tp.relation_ids
        assert run.relations == (rels[relid],)
        assert run.commit_lsn == 1099
        assert run == oracle(batch, tp.ordinals, tp.relation_ids)[0]
