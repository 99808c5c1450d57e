"""Bad input stops with a clear message naming what and where, and loses nothing."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import psycopg
import pytest

from sparkapply.commands.resync import resync
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.errors import (
    ConfigError,
    PublicationError,
    SlotError,
    SourceError,
)
from sparkapply.sink.read import read_table
from tests.conftest import PgServer
from tests.mirror import Mirror, cli, killed

pytestmark = pytest.mark.integration


def test_missing_publication(mirror: Mirror) -> None:
    with pytest.raises(PublicationError, match=r"publication 'pub' does not exist") as info:
        mirror.run()
    assert "CREATE PUBLICATION" in str(info.value)


def test_slot_of_the_wrong_kind(mirror: Mirror) -> None:
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE t",
        f"SELECT pg_create_physical_replication_slot('{mirror.slot}')",
    )
    try:
        with pytest.raises(SlotError, match="is a physical slot") as info:
            mirror.run()
        assert "choose another [source] slot" in str(info.value)
    finally:
        # Physical slots belong to no database: drop it before the next test.
        mirror.sql(f"SELECT pg_drop_replication_slot('{mirror.slot}')")


def test_an_invalidated_slot_stops_the_run_with_the_way_on(mirror: Mirror) -> None:
    """A slot the publisher invalidated (it held back more WAL than
    max_slot_wal_keep_size) has lost changes the mirror needs: the run stops, saying so
    and how to go on. Done as it says (drop the slot, run), the tables are copied
    again and equal the publisher's."""
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    with psycopg.connect(mirror.dsn, autocommit=True) as conn:
        slots = [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots")]
        assert slots == [mirror.slot]  # no other test's slot is put at risk
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            for n in range(4):
                conn.execute("UPDATE t SET v = %s WHERE id <= 10", (f"lost {n}",))
                conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            row = conn.execute(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (mirror.slot,)
            ).fetchone()
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
    assert row is not None and row[0] == "lost"
    with pytest.raises(SlotError, match="was invalidated by the publisher") as info:
        mirror.run()
    assert f"pg_drop_replication_slot('{mirror.slot}')" in (info.value.hint or "")
    mirror.sql(f"SELECT pg_drop_replication_slot('{mirror.slot}')", "DELETE FROM t WHERE id = 50")
    mirror.run()
    mirror.assert_mirrored("public.t")
    mirror.sql("UPDATE t SET v = 'after' WHERE id = 1")
    mirror.run()
    mirror.assert_mirrored("public.t")


def test_two_publishers_cannot_share_a_cuts_table(
    mirror: Mirror, pg_server: PgServer, spark: object
) -> None:
    """Two databases mirrored into one catalog: their LSNs cannot be ordered, so one
    cuts table cannot hold both's cuts (the newest would be either's). The second
    subscriber refuses to start, naming the key, before it writes anything; with its
    own cuts table it runs."""
    mirror.sql("CREATE TABLE a (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE a")
    mirror.run()
    name = pg_server.create_database("second")
    try:
        other = Mirror(pg_server.dsn(name), mirror.config.work_dir.parent / "second", spark)
        # The first mirror's catalog and warehouse (public.a there, public.b here).
        sink = dataclasses.replace(mirror.config.sink, catalog=mirror.config.catalog_properties())
        other.config = dataclasses.replace(other.config, sink=sink)
        other.sql("CREATE TABLE b (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE b")
        with pytest.raises(ConfigError, match="holds the cuts of another publisher") as info:
            other.run()
        assert info.value.context["key"] == "sink.cuts_table"
        assert f"database {name}" in str(info.value)
        with psycopg.connect(other.dsn) as conn:  # refused before the slot and the copy
            assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (1,)
        assert not mirror.catalog.table_exists(("public", "b"))
        other.config = dataclasses.replace(
            other.config, sink=dataclasses.replace(sink, cuts_table="sparkapply.cuts_second")
        )
        other.sql("INSERT INTO b VALUES (1)")
        other.run()
        other.assert_mirrored("public.b")
        mirror.sql("INSERT INTO a VALUES (1)")
        mirror.run()  # the first still runs on its own
        mirror.assert_mirrored("public.a")
    finally:
        pg_server.drop_database(name)


def test_resync_after_a_type_change_replaces_the_column(mirror: Mirror, tmp_path: Path) -> None:
    """A resync while stopped, after a type change Iceberg cannot widen (a run would
    copy the table again itself: tests/e2e/test_field_ids.py)."""
    mirror.sql("CREATE TABLE t (id int PRIMARY KEY, n int)", "CREATE PUBLICATION pub FOR TABLE t")
    mirror.run()
    mirror.sql("INSERT INTO t VALUES (1, 1), (2, 2)")
    mirror.run()
    mirror.sql("ALTER TABLE t ALTER COLUMN n TYPE text", "INSERT INTO t VALUES (3, 'three')")

    # The resync copies the table again and replaces the column (in its place) with
    # one of the new type; the stream then goes on past the ALTER.
    old_snapshot = mirror.iceberg_table("public.t").current_snapshot()
    assert old_snapshot is not None
    mirror.sql("ALTER TABLE t ADD COLUMN later int", "INSERT INTO t VALUES (4, 'four', 4)")
    # A resync killed after the column was replaced and before its copy committed
    # leaves the table marked to be copied again (the replaced column is null in it).
    cfg = mirror.write_config(tmp_path / "resync.toml")
    killed("copy-before-commit", "resync", "--config", str(cfg), "--table", "public.t")
    table = mirror.catalog.load_table(("public", "t"))
    assert str(table.schema().find_field("n").field_type) == "string"
    assert table.properties["sparkapply.copy-again"] == "column(s) n replaced"
    resync(mirror.config, "public.t", spark=mirror.spark, catalog=mirror.catalog)
    assert "sparkapply.copy-again" not in mirror.catalog.load_table(("public", "t")).properties
    mirror.sql("UPDATE t SET n = n || '!' WHERE id <= 3", "INSERT INTO t VALUES (5, 'five', 5)")
    mirror.run()
    mirror.assert_mirrored("public.t")
    assert [f.name for f in mirror.iceberg_table("public.t").schema().fields] == [
        "id",
        "n",
        "later",
    ]
    _, rows = mirror.iceberg_rows("public.t")
    assert sorted(rows) == [
        (1, "1!", None),
        (2, "2!", None),
        (3, "three!", None),
        (4, "four", 4),
        (5, "five", 5),
    ]
    # The replaced column is a new field: a snapshot before the resync reads the old one.
    before = read_table(mirror.iceberg_table("public.t"), snapshot_id=old_snapshot.snapshot_id)
    assert sorted(before.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "n": 1},
        {"id": 2, "n": 2},
    ]


def test_wal_level_replica_is_refused(tmp_path: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="sparkapply-test-replica-"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "data", settings={"wal_level": "replica"})
    pg.start()
    try:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
            conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        mirror = Mirror(pg.dsn(), tmp_path / "work", spark=None)
        with pytest.raises(SourceError, match="wal_level=replica") as info:
            mirror.run()
        assert "wal_level = logical" in str(info.value)
    finally:
        pg.stop("immediate")


def test_cli_reports_operator_error_with_exit_code_2(pg_dsn: str, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'work_dir = "{tmp_path}/w"\n[source]\ndsn = "{pg_dsn} password=s3cret"\n'
        'publication = "nope"\n'
        f'[sink.catalog]\ntype = "sql"\nuri = "sqlite:///{tmp_path}/c.db"\n'
    )
    proc = cli("run", "--config", str(cfg), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "publication 'nope' does not exist" in proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout


def test_cli_rejects_unknown_config_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[source]\ndsn = "x"\npublication = "p"\nslott = "s"\n')
    proc = cli("run", "--config", str(cfg), timeout=60)
    assert proc.returncode == 2
    assert "unknown configuration key source.slott" in proc.stderr
