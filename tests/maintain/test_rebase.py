"""The position translation that carries deletes over a compaction, on values."""

from __future__ import annotations

import numpy as np

from sparkapply.maintain.rebase import translate
from sparkapply.maintain.tasks import Moved


def positions(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def test_rows_after_deleted_ones_move_up() -> None:
    # a.parquet rows 0-9, rows 2 and 5 deleted at the plan: rows 0,1,3,4,6.. went to
    # new.parquet from row 100 on, in order.
    moved = {"a": Moved("new", 100, positions(2, 5))}
    got = translate(moved, {"a": positions(0, 3, 6, 9)})
    assert list(got) == ["new"]
    assert got["new"].tolist() == [100, 102, 104, 107]


def test_files_not_rewritten_and_positions_deleted_at_the_plan_are_left_out() -> None:
    moved = {"a": Moved("new", 0, positions(4))}
    got = translate(moved, {"a": positions(4, 4, 1), "b": positions(0), "c": positions()})
    assert {p: v.tolist() for p, v in got.items()} == {"new": [1]}
    assert translate(moved, {"a": positions(4)}) == {}


def test_two_files_into_one_are_merged_sorted() -> None:
    moved = {"a": Moved("new", 0, positions()), "b": Moved("new", 10, positions(0))}
    got = translate(moved, {"b": positions(1, 3), "a": positions(9, 0)})
    assert got["new"].tolist() == [0, 9, 10, 12]


def test_a_translation_agrees_with_copying_the_rows() -> None:
    """Against the copy itself: rows with their ids, some deleted at the plan, copied
    in order after other rows; a later delete by position names the same ids after."""
    rng = np.random.default_rng(7)
    ids = np.arange(1_000, 1_200)
    at_plan = np.sort(rng.choice(len(ids), 40, replace=False))
    live = np.ones(len(ids), bool)
    live[at_plan] = False
    copied = np.concatenate([np.arange(-5, 0), ids[live]])  # 5 rows of another file first
    later = rng.choice(np.flatnonzero(live), 30, replace=False)
    got = translate({"a": Moved("new", 5, at_plan)}, {"a": later})["new"]
    assert sorted(copied[got].tolist()) == sorted(ids[later].tolist())
