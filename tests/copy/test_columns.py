"""When a RELATION means a table must be copied again (copy/columns.py): pure cases."""

from __future__ import annotations

from sparkapply.copy.columns import CatalogColumn, judge

PLAIN = False
FILLED = True


def col(attnum: int, filled: bool = PLAIN) -> CatalogColumn:
    return CatalogColumn(attnum, filled)


def test_a_relation_the_mirror_already_holds_changes_nothing() -> None:
    v = judge(["id", "v"], {"id": 1, "v": 2}, {"id", "v"}, 2, {"id": col(1), "v": col(2)})
    assert v.copy_again == () and v.numbers == {"id": 1, "v": 2}


def test_a_plain_added_column_is_recorded_not_copied() -> None:
    v = judge(["id", "c"], {"id": 1}, {"id"}, 2, {"id": col(1), "c": col(3)})
    assert v.copy_again == () and v.numbers == {"id": 1, "c": 3}


def test_a_column_added_with_a_default_is_copied() -> None:
    v = judge(["id", "c"], {"id": 1}, {"id"}, 2, {"id": col(1), "c": col(3, FILLED)})
    assert v.copy_again == ("c",)


def test_a_column_that_existed_at_the_copy_is_copied() -> None:
    """Added to the column list, or renamed from a column the mirror had: numbered at
    or below the highest number at the copy."""
    v = judge(["id", "b"], {"id": 1}, {"id"}, 3, {"id": col(1), "b": col(3)})
    assert v.copy_again == ("b",)


def test_a_column_dropped_and_added_again_under_its_name_is_copied() -> None:
    v = judge(["id", "v"], {"id": 1, "v": 2}, {"id", "v"}, 2, {"id": col(1), "v": col(5)})
    assert v.copy_again == ("v",) and v.numbers["v"] == 5


def test_a_column_dropped_since_the_relation_is_left_alone() -> None:
    v = judge(["id", "gone"], {"id": 1}, {"id"}, 9, {"id": col(1)})
    assert v.copy_again == () and v.numbers == {"id": 1}


def test_a_table_without_recorded_numbers_takes_what_it_holds_as_it_is() -> None:
    """Copied by an older version: its held columns are not judged (a serial key has
    a default, and must not copy every such table again); a new one is."""
    catalog = {"id": col(1, FILLED), "v": col(2), "c": col(3, FILLED)}
    v = judge(["id", "v", "c"], None, {"id", "v"}, 0, catalog)
    assert v.copy_again == ("c",) and v.numbers == {"id": 1, "v": 2, "c": 3}
    v = judge(["id", "v"], None, {"id", "v"}, 0, catalog)
    assert v.copy_again == () and v.numbers == {"id": 1, "v": 2}
