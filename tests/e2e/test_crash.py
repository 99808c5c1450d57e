"""Crash safety: SIGKILL at named points, restart, and the tables are exactly right."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sparkapply.errors import CutError
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.progress import applied_lsn, lineage_lsn
from sparkapply.sink.read import latest_cut
from tests.conftest import PgServer
from tests.mirror import Mirror

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _workload(mirror: Mirror, pg_server: PgServer) -> None:
    mirror.sql(
        "INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 300) g",
        "INSERT INTO b SELECT g, g FROM generate_series(1, 100) g",
        "BEGIN; UPDATE a SET v = 'multi' WHERE id <= 50; DELETE FROM b WHERE id <= 10; COMMIT",
        "BEGIN; INSERT INTO b VALUES (1000, 1); PREPARE TRANSACTION 'p1'",
    )
    pg_server.set_streaming("immediate")
    try:
        with psycopg.connect(mirror.dsn) as conn:
            conn.execute("INSERT INTO a SELECT g, 'streamed' FROM generate_series(301, 600) g")
            conn.execute("SAVEPOINT s1")
            conn.execute("DELETE FROM a WHERE id <= 100")
            conn.execute("ROLLBACK TO SAVEPOINT s1")
            conn.execute("UPDATE a SET id = id + 10000 WHERE id BETWEEN 500 AND 510")
            conn.commit()
    finally:
        pg_server.set_streaming("buffered")
    mirror.sql(
        "UPDATE b SET n = n + 1",
        "COMMIT PREPARED 'p1'",
        "TRUNCATE b",
        "INSERT INTO b SELECT g, -g FROM generate_series(1, 20) g",
    )


@pytest.mark.parametrize(
    "failpoint",
    [
        "feed:40",  # mid-transaction, before anything is durable
        "feed:700",  # in the middle of a streamed chunk
        "after-stage",  # PREPARE staged, not yet acknowledged
        "before-commit",  # executors wrote files, nothing committed
        "deletes-written",  # position-delete files written (merge-on-read), not committed
        "before-catalog-swap",  # every table's metadata written, no pointer swapped
        "before-catalog-swap:3",  # a later batch
        "after-catalog-swap",  # every pointer swapped, nothing acknowledged
        "after-catalog-swap:2",
        "before-ack",  # every table committed, nothing acknowledged
        # Committed table by table ([sink] atomic_commit = false, or a catalog that
        # cannot): one table of a batch committed, the other not.
        "per-table:after-table-commit",
        "per-table:after-table-commit:4",  # a later batch
    ],
)
def test_kill_and_restart(
    mirror: Mirror, pg_server: PgServer, tmp_path: Path, failpoint: str
) -> None:
    mirror.sql(
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY, n int)",
        "CREATE PUBLICATION pub FOR TABLE a, b",
    )
    mirror.run()  # slot and catalog exist
    _workload(mirror, pg_server)
    per_table = failpoint.startswith("per-table:")
    mirror.run_killed(
        failpoint.removeprefix("per-table:"),
        tmp_path,
        atomic_commit=not per_table,
        batch_max_transactions=3,
    )
    if not per_table:  # all of a batch or none of it, its cut included
        _assert_tables_at_the_latest_cut(mirror, ("public.a", "public.b"))
    mirror.run()
    mirror.assert_mirrored("public.a", "public.b")


def _assert_tables_at_the_latest_cut(mirror: Mirror, tables: tuple[str, ...]) -> None:
    catalog = open_catalog("check", mirror.config.catalog_properties())
    try:
        cut = latest_cut(catalog)
    except CutError:  # killed before the first batch committed
        return
    for table in tables:
        if table not in cut.tables:
            continue
        # The cut's snapshot holds what the table holds now (maintenance may have
        # rewritten it since: same rows, same LSN).
        iceberg = catalog.load_table(table)
        at_cut = lineage_lsn(iceberg.metadata, cut.tables[table])
        assert at_cut == applied_lsn(iceberg), (table, str(cut.lsn), at_cut)


def test_kill_between_prepare_and_commit_prepared(
    mirror: Mirror, pg_server: PgServer, tmp_path: Path
) -> None:
    mirror.sql(
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION pub FOR TABLE a",
    )
    mirror.run()
    mirror.sql(
        "INSERT INTO a VALUES (1, 'before')",
        "BEGIN; INSERT INTO a SELECT g, 'prepared' FROM generate_series(2, 200) g;"
        " PREPARE TRANSACTION 'gx'",
        "INSERT INTO a VALUES (1000, 'after prepare')",
    )
    mirror.run_killed(
        "before-ack", tmp_path, batch_max_transactions=3
    )  # killed once the first batch is durable
    mirror.run()  # stages the prepare durably and acknowledges it
    mirror.sql("COMMIT PREPARED 'gx'")
    mirror.run()
    mirror.assert_mirrored("public.a")
