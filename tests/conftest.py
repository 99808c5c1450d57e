"""Shared fixtures: one PostgreSQL server per test run, a fresh database per test.

``SPARKAPPLY_TEST_DSN`` may point the tests at an existing PostgreSQL 16+ server
(a superuser connection with ``wal_level=logical``); otherwise the bundled server from
the ``pgserver`` wheel is started with logical-replication settings that force the
rare paths (streaming of every transaction).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from sparkapply.embedded import EmbeddedPostgres
from tests.seaweedfs import SeaweedFS, running_seaweedfs

TEST_SETTINGS = {
    "logical_decoding_work_mem": "64kB",
    "debug_logical_replication_streaming": "buffered",
    "wal_sender_timeout": "20s",
}


def _drop_slot(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> None:
    """Drop a slot, waiting for a terminated walsender to let go of it."""
    deadline = time.monotonic() + 30
    while True:
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class PgServer:
    """What tests need of the server: DSNs and a way to make databases."""

    def __init__(self, admin_dsn: str, embedded: EmbeddedPostgres | None) -> None:
        self.admin_dsn = admin_dsn
        self.embedded = embedded
        self._counter = itertools.count()

    def dsn(self, dbname: str) -> str:
        return psycopg.conninfo.make_conninfo(self.admin_dsn, dbname=dbname)

    def sqlalchemy_url(self, dbname: str) -> str:
        """A database as a SQLAlchemy URL for psycopg 3 (a SQL catalog's ``uri``)."""
        p = psycopg.conninfo.conninfo_to_dict(self.dsn(dbname))
        auth = str(p.get("user", ""))
        if p.get("password"):
            auth += f":{p['password']}"
        return f"postgresql+psycopg://{auth}@/{dbname}?host={p['host']}&port={p.get('port', 5432)}"

    def create_database(self, prefix: str = "t", encoding: str | None = None) -> str:
        """A new database; ``encoding``: in that encoding (C locale), not the default."""
        name = f"{prefix}_{os.getpid()}_{next(self._counter)}"
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if encoding is not None:
            create = sql.SQL(
                "{} TEMPLATE template0 ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C'"
            ).format(create, sql.Literal(encoding))
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(create)
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            slots = [
                r[0]
                for r in conn.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
                ).fetchall()
            ]
            for slot in slots:
                conn.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND active_pid IS NOT NULL",
                    (slot,),
                )
                _drop_slot(conn, slot)
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)
            ).fetchall():
                with psycopg.connect(self.dsn(name), autocommit=True) as c2:
                    c2.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def set_streaming(self, mode: str) -> None:
        """Server-wide ``debug_logical_replication_streaming`` (buffered|immediate)."""
        self.set_setting("debug_logical_replication_streaming", mode)

    def set_setting(self, name: str, value: str) -> None:
        """``ALTER SYSTEM SET`` and reload (new and running walsenders pick it up)."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
            conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    dsn = os.environ.get("SPARKAPPLY_TEST_DSN")
    if dsn:
        yield PgServer(dsn, None)
        return
    # Not under pytest's basetemp: pytest resets that to mode 0700, and the server runs
    # as another user when the tests run as root.
    root = Path(tempfile.mkdtemp(prefix="sparkapply-test-pg-"))
    os.chmod(root, 0o755)
    server = EmbeddedPostgres(root / "data", settings=TEST_SETTINGS)
    server.start()
    try:
        yield PgServer(server.dsn(), server)
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh database for one test; dropped (with its slots) afterwards."""
    name = pg_server.create_database()
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFS]:
    """One SeaweedFS (S3 and an Iceberg REST catalog) per test run, on loopback."""
    with running_seaweedfs() as server:
        yield server


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark session for the whole run (2 cores)."""
    from sparkapply.apply.session import get_session

    session = get_session("local[2]", "sparkapply-tests", {"spark.driver.memory": "2g"})
    yield session
    session.stop()


@pytest.fixture()
def mirror(pg_dsn: str, tmp_path: Path, spark: object) -> object:
    from tests.mirror import Mirror

    return Mirror(pg_dsn, tmp_path / "work", spark)
