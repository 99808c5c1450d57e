"""The publisher's versions: PostgreSQL 15, 16, 17 and 18, each a real server.

16 is the bundled ``pgserver``; 15 is Debian's ``postgresql-15`` and 17/18 the npm
builds, all installed by ``scripts/bootstrap.sh`` (a missing one fails, never skips).
Each server is started once for its tests, configured to force the rare paths
(every large transaction streamed, ``immediate`` streaming where the GUC exists), and
logs its replication commands, so that the test reads the protocol that was really
negotiated from the server's own log.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from sparkapply.embedded import EmbeddedPostgres, installed_bin_dir
from sparkapply.source.connection import session_conninfo
from sparkapply.verify.canonical import sql_hash, text_hash
from sparkapply.verify.publisher import check_hash
from tests.e2e.test_verify_values import prove
from tests.mirror import Mirror
from tests.servers import own_server
from tests.verify.values import COLUMNS

pytestmark = pytest.mark.integration

VERSIONS = (15, 16, 17, 18)
EXPECTED_PROTOCOL = {
    15: ("3", "on"),
    16: ("4", "parallel"),
    17: ("4", "parallel"),
    18: ("4", "parallel"),
}


@pytest.fixture(scope="module", params=VERSIONS, ids=lambda v: f"pg{v}")
def server(request: pytest.FixtureRequest) -> Iterator[EmbeddedPostgres]:
    major: int = request.param
    settings = {
        "logical_decoding_work_mem": "64kB",
        "wal_sender_timeout": "20s",
        "log_replication_commands": "on",
    }
    if major >= 16:
        settings["debug_logical_replication_streaming"] = "immediate"
    with own_server(f"pg{major}", settings, installed_bin_dir(major)) as pg:
        assert pg.version == major
        yield pg


def _server_version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version // 10000


def _start_replication_options(pg: EmbeddedPostgres, slot: str) -> dict[str, str]:
    """The options of the last START_REPLICATION for ``slot`` in the server's log."""
    log = (pg.data_dir / "server.log").read_text(errors="replace")
    commands = [line for line in log.splitlines() if "START_REPLICATION" in line and slot in line]
    assert commands, f"no START_REPLICATION for {slot} in the server log"
    return dict(re.findall(r'"(\w+)" \'([^\']*)\'', commands[-1]))


def test_workload_mirrors_and_protocol(
    server: EmbeddedPostgres, tmp_path: Path, spark: object
) -> None:
    dsn = server.dsn()
    assert _server_version(dsn) == server.version
    mirror = Mirror(dsn, tmp_path / "work", spark, slot=f"versions_{server.version}")
    mirror.sql(
        "DROP PUBLICATION IF EXISTS pub",
        "DROP TABLE IF EXISTS items, notes, tags",
        "CREATE TABLE items (id int PRIMARY KEY, name text, qty int, price numeric(10,2), "
        "at timestamptz, doc jsonb)",
        "CREATE TABLE notes (id bigint PRIMARY KEY, body text)",
        "CREATE TABLE tags (tag text, item int)",
        "ALTER TABLE tags REPLICA IDENTITY FULL",
        # Rows before the slot exists: the initial copy from the exported snapshot.
        "INSERT INTO items SELECT g, 'item ' || g, g % 7, g / 4.0, "
        "timestamptz '2026-01-01' + g * interval '1 hour', jsonb_build_object('g', g) "
        "FROM generate_series(1, 500) g",
        "INSERT INTO tags SELECT 't' || (g % 5), g FROM generate_series(1, 50) g",
        "CREATE PUBLICATION pub FOR TABLE items, notes, tags",
    )
    mirror.run()
    mirror.assert_mirrored("public.items", "public.tags")

    # Ordinary transactions: inserts, updates (one changes a key), deletes.
    mirror.sql(
        "INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 100) g",
        "UPDATE items SET qty = qty + 100, name = name || ' (updated)' WHERE id % 3 = 0",
        "UPDATE items SET id = id + 10000 WHERE id BETWEEN 1 AND 5",
        "DELETE FROM items WHERE id % 11 = 0",
        "UPDATE tags SET item = -item WHERE tag = 't1'",
        "DELETE FROM tags WHERE tag = 't2'",
    )
    # A large transaction (streamed: far over logical_decoding_work_mem) with a
    # rolled-back savepoint whose changes must not arrive.
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO notes SELECT g, repeat('x', 50) || g FROM generate_series(1000, 6000) g"
        )
        conn.execute("SAVEPOINT s1")
        conn.execute("INSERT INTO notes SELECT g, 'rolled back' FROM generate_series(7000, 9000) g")
        conn.execute("UPDATE items SET name = 'rolled back'")
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        conn.execute("UPDATE notes SET body = 'streamed update' WHERE id % 10 = 0")
        conn.execute("DELETE FROM notes WHERE id BETWEEN 5000 AND 5100")
        conn.commit()
    # Two-phase: one prepared transaction committed after later work, one rolled back.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("UPDATE items SET price = 0 WHERE id <= 50")
        conn.execute("INSERT INTO tags VALUES ('prepared', 1)")
        conn.execute("PREPARE TRANSACTION 'versions-commit'")
        conn.execute("BEGIN")
        conn.execute("DELETE FROM notes")
        conn.execute("PREPARE TRANSACTION 'versions-rollback'")
        conn.execute("UPDATE items SET qty = -1 WHERE id = 70")
        conn.execute("COMMIT PREPARED 'versions-commit'")
        conn.execute("ROLLBACK PREPARED 'versions-rollback'")
    mirror.run()
    mirror.assert_mirrored("public.items", "public.notes", "public.tags")
    # The streamed transaction really was streamed, as the matrix means to test.
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s",
            (mirror.slot,),
        ).fetchone()
    assert row is not None and row[0] >= 1, f"nothing was streamed: {row}"

    options = _start_replication_options(server, mirror.slot)
    proto, streaming = EXPECTED_PROTOCOL[server.version]
    assert options.get("proto_version") == proto, options
    assert options.get("streaming") == streaming, options
    assert options.get("two_phase") == "on", options


def test_generated_columns_not_published(
    server: EmbeddedPostgres, tmp_path: Path, spark: object
) -> None:
    """A stored generated column that the publication does not publish (every
    version's default) is not in the mirror: not copied, never streamed. PostgreSQL
    15 lists it in pg_publication_tables all the same; copied, it went stale at the
    first update, which never carries it."""
    mirror = Mirror(
        server.dsn(), tmp_path / "work", spark, slot="versions_ungen", publication="ungen_pub"
    )
    mirror.sql(
        "DROP TABLE IF EXISTS ungen",
        "CREATE TABLE ungen (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) STORED)",
        "INSERT INTO ungen (id, a) SELECT g, g FROM generate_series(1, 20) g",
        "CREATE PUBLICATION ungen_pub FOR TABLE ungen",
    )
    mirror.run()
    mirror.sql(
        "UPDATE ungen SET a = a + 100 WHERE id <= 5", "INSERT INTO ungen (id, a) VALUES (99, 1)"
    )
    mirror.run()
    cols, rows = mirror.iceberg_rows("public.ungen")
    assert cols == ["id", "a"]
    with psycopg.connect(server.dsn()) as conn:
        published = conn.execute("SELECT id, a FROM ungen").fetchall()
    assert sorted(rows) == sorted(published)
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("DROP PUBLICATION ungen_pub")
        conn.execute("SELECT pg_drop_replication_slot('versions_ungen')")


def test_generated_columns_published_on_18(
    server: EmbeddedPostgres, tmp_path: Path, spark: object
) -> None:
    """PostgreSQL 18 can publish stored generated columns; they arrive like any other."""
    if server.version < 18:
        # Before 18 a publication cannot include generated columns; what the other
        # servers publish is checked in the test above.
        with (
            psycopg.connect(server.dsn(), autocommit=True) as conn,
            pytest.raises(psycopg.errors.SyntaxError),
        ):
            conn.execute(
                "CREATE PUBLICATION gen_pub_old FOR ALL TABLES "
                "WITH (publish_generated_columns = stored)"
            )
        return
    dsn = server.dsn()
    mirror = Mirror(dsn, tmp_path / "work", spark, slot="versions_generated", publication="gen_pub")
    mirror.sql(
        "CREATE TABLE gen (id int PRIMARY KEY, qty int, price numeric(10,2), "
        "total numeric(12,2) GENERATED ALWAYS AS (qty * price) STORED)",
        "INSERT INTO gen (id, qty, price) SELECT g, g, 1.5 FROM generate_series(1, 20) g",
        "CREATE PUBLICATION gen_pub FOR TABLE gen WITH (publish_generated_columns = stored)",
    )
    mirror.run()
    mirror.sql(
        "INSERT INTO gen (id, qty, price) SELECT g, g, 2.25 FROM generate_series(21, 40) g",
        "UPDATE gen SET qty = qty * 10 WHERE id % 4 = 0",
        "DELETE FROM gen WHERE id % 9 = 0",
    )
    mirror.run()
    cols, rows = mirror.iceberg_rows("public.gen")
    assert "total" in cols
    totals = {r[cols.index("id")]: r[cols.index("total")] for r in rows}
    assert totals[8] is not None and float(totals[8]) == 80 * 1.5
    mirror.assert_mirrored("public.gen")


def test_verify_hashes_rows_as_every_version_does(server: EmbeddedPostgres) -> None:
    """verify's row hash is the server's hashtextextended: the same on 15 to 18."""
    texts = ["", "x" * 11, "row\x1f12\x1e", "é€😀" * 7, "y" * 1000]
    with psycopg.connect(session_conninfo(server.dsn()), autocommit=True) as conn:
        check_hash(conn)
        query = sql.SQL("SELECT {} FROM unnest(%s::text[]) WITH ORDINALITY u(v, n) ORDER BY n")
        got = [r[0] for r in conn.execute(query.format(sql_hash(sql.SQL("v"))), (texts,))]
    assert got == [text_hash(t) for t in texts]


def test_verify_proves_the_mapped_types(
    server: EmbeddedPostgres, tmp_path: Path, spark: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify's proof over every mapped type (``test_verify_values.py``, which runs the
    full one on the suite's PostgreSQL 16), smaller, on every version of the matrix."""
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS verify_values WITH (FORCE)")
        conn.execute("CREATE DATABASE verify_values")
    dsn = psycopg.conninfo.make_conninfo(server.dsn(), dbname="verify_values")
    mirror = Mirror(dsn, tmp_path / "work", spark, slot=f"values_{server.version}")
    try:
        prove(mirror, mirror.write_config(tmp_path / "verify.toml"), COLUMNS, capsys, count=6)
    finally:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s AND NOT active",
                (mirror.slot,),
            )
