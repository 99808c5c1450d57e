"""The table locks between the apply and maintenance beside it (sink/locks.py)."""

from __future__ import annotations

import threading

import pytest

from sparkapply.sink.locks import TableLocks

T = ("public", "t")
U = ("public", "u")


def test_a_maintenance_commit_is_reported_to_the_next_holder_once() -> None:
    locks = TableLocks()
    with locks.committing(T):
        pass
    assert locks.changed() == {T}
    with locks.hold([U]) as changed:
        assert changed == set()  # not a table it holds
    with locks.hold([T, U]) as changed:
        assert changed == {T}
    with locks.hold([T]) as changed:
        assert changed == set()


def test_a_failed_commit_changes_nothing() -> None:
    locks = TableLocks()
    with pytest.raises(RuntimeError), locks.committing(T):
        raise RuntimeError("conflict")
    assert locks.changed() == set()


def test_a_commit_waits_for_the_apply_holding_the_table() -> None:
    locks = TableLocks()
    order: list[str] = []
    entered = threading.Event()

    def maintenance() -> None:
        entered.set()
        with locks.committing(T):
            order.append("maintenance commit")

    with locks.hold([T, U]):
        thread = threading.Thread(target=maintenance)
        thread.start()
        entered.wait(10)
        thread.join(0.2)  # it cannot get in while the apply holds the table
        order.append("apply commit")
    thread.join(10)
    assert order == ["apply commit", "maintenance commit"]
