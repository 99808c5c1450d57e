"""End to end: PostgreSQL → sparkapply → Iceberg, compared row by row."""

from __future__ import annotations

import pytest

from tests.mirror import Mirror

pytestmark = pytest.mark.integration


def test_insert_update_delete(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(10,2))",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()  # creates the slot; nothing to apply yet
    mirror.sql(
        "INSERT INTO t SELECT g, 'v' || g, g / 3.0 FROM generate_series(1, 500) g",
        "UPDATE t SET v = 'changed' WHERE id % 10 = 0",
        "DELETE FROM t WHERE id % 7 = 0",
        "UPDATE t SET id = id + 1000 WHERE id BETWEEN 1 AND 5",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
