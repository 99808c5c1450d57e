"""Capture real pgoutput bytes from a PostgreSQL server; the representative workload.

Capture goes through the SQL interface: a ``pgoutput`` slot created with two-phase
decoding enabled, read with ``pg_logical_slot_get_binary_changes``. Each row it returns
is exactly one pgoutput message (the payload a walsender puts after the XLogData
header), so no framing has to be undone. PostgreSQL 16 accepts ``streaming 'parallel'``
there too, which makes STREAM ABORT carry the abort LSN and time (protocol 4).

THINGS THAT BITE

* The SQL interface decodes only WAL that is already *flushed*. The bundled server runs
  with ``synchronous_commit=off``, so a transaction that just committed may not be
  visible yet. :meth:`PgoutputCapture.read` first runs CHECKPOINT, which flushes all
  WAL and emits no pgoutput message (see :func:`flush_wal`).
* Whether and when a transaction is streamed is decided at *decoding* time, by the
  reading session's ``debug_logical_replication_streaming`` and
  ``logical_decoding_work_mem`` (both user-settable). :meth:`PgoutputCapture.read`
  sets them with ``SET LOCAL``, so nothing leaks into other tests.
* Each call of ``pg_logical_slot_get_binary_changes`` is a new decoding context: the
  pgoutput relation cache starts empty, so the first change of each relation is again
  preceded by its RELATION (and TYPE) messages. Concatenating the output of several
  calls is still a stream a walsender could have sent.

The messages are stored in capture files (:mod:`tests.pgoutput.capture_file`).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql

from sparkapply.lsn import Lsn
from tests.pgoutput.capture_file import Captured, CaptureFile

StreamingOption = Literal["off", "on", "parallel"]
DecodingStreaming = Literal["buffered", "immediate"]


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """The pgoutput output-plugin options (what a subscriber sends in START_REPLICATION)."""

    proto_version: int = 4
    streaming: StreamingOption = "parallel"
    two_phase: bool = True
    messages: bool = True
    binary: bool = False
    origin: Literal["any", "none"] | None = None  # None: not sent (server default 'any')

    def plugin_options(self, publication: str) -> list[str]:
        """Name/value pairs, flattened, for the SQL interface's VARIADIC options."""
        opts = [
            "proto_version",
            str(self.proto_version),
            "publication_names",
            publication,
            "streaming",
            self.streaming,
            "two_phase",
            "on" if self.two_phase else "off",
            "messages",
            "true" if self.messages else "false",
            "binary",
            "true" if self.binary else "false",
        ]
        if self.origin is not None:
            opts += ["origin", self.origin]
        return opts

    def header(self) -> dict[str, Any]:
        return {
            "proto_version": self.proto_version,
            "streaming": self.streaming,
            "two_phase": self.two_phase,
            "messages": self.messages,
            "binary": self.binary,
            "origin": self.origin or "any",
        }


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection for workloads (what every helper here expects)."""
    return psycopg.connect(dsn, autocommit=True)


def flush_wal(conn: psycopg.Connection[Any]) -> None:
    """Make everything written so far durable, so the SQL interface can decode it.

    A CHECKPOINT flushes all WAL before its record and emits nothing through pgoutput.
    (A synchronously committed transaction would not do: one that writes no WAL is
    not flushed, and one that writes catalog rows shows up as an empty streamed
    transaction when decoding streams immediately.)
    """
    conn.execute("CHECKPOINT")


def current_lsn(conn: psycopg.Connection[Any]) -> Lsn:
    """The server's current WAL insert position."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def current_xid(conn: psycopg.Connection[Any]) -> int:
    """The top-level xid of the open transaction on ``conn`` (assigns one)."""
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return int(row[0]) & 0xFFFFFFFF


def row_xmin(conn: psycopg.Connection[Any], table: str, where: str) -> int:
    """``xmin`` of one row: the (sub)transaction that wrote it, as seen by its writer."""
    row = conn.execute(f"SELECT xmin::text::bigint FROM {table} WHERE {where}").fetchone()
    assert row is not None, f"no row in {table} where {where}"
    return int(row[0])


class PgoutputCapture:
    """A publication and a two-phase ``pgoutput`` slot in one database, read via SQL.

    Call :meth:`setup` after the schema exists (or use ``FOR ALL TABLES``), run the
    workload on other connections, then :meth:`read` returns (and consumes) everything
    decoded since the previous read.
    """

    def __init__(
        self,
        dsn: str,
        *,
        slot: str = "sparkapply_capture",
        publication: str = "sparkapply_capture",
        options: CaptureOptions | None = None,
    ) -> None:
        self.dsn = dsn
        self.slot = slot
        self.publication = publication
        self.options = options or CaptureOptions()
        self.conn = connect(dsn)
        self._slot_created = False

    def __enter__(self) -> PgoutputCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def server_version(self) -> int:
        return self.conn.info.server_version

    def setup(self, publication_target: str = "FOR ALL TABLES", *, with_: str = "") -> None:
        """Create the publication (``CREATE PUBLICATION name <target> [WITH (...)]``) and
        the slot, with two-phase decoding enabled at creation."""
        stmt = sql.SQL("CREATE PUBLICATION {} ").format(sql.Identifier(self.publication))
        stmt += sql.SQL(publication_target)
        if with_:
            stmt += sql.SQL(f" WITH ({with_})")
        self.conn.execute(stmt)
        self.create_slot()

    def create_slot(self) -> Lsn:
        row = self.conn.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
            (self.slot, self.options.two_phase),
        ).fetchone()
        assert row is not None
        self._slot_created = True
        return Lsn.parse(row[0])

    def iter_read(
        self,
        *,
        decoding: DecodingStreaming = "buffered",
        work_mem: str | None = None,
        upto_lsn: int | None = None,
        peek: bool = False,
        batch: int = 10_000,
    ) -> Iterator[Captured]:
        """Decode and consume (or ``peek``) the slot, yielding messages as they come."""
        flush_wal(self.conn)
        func = (
            "pg_logical_slot_peek_binary_changes" if peek else "pg_logical_slot_get_binary_changes"
        )
        query = (
            f"SELECT lsn::text, xid::text::bigint, data FROM {func}"
            "(%s, %s::pg_lsn, NULL, VARIADIC %s::text[])"
        )
        params = (
            self.slot,
            None if upto_lsn is None else str(Lsn(upto_lsn)),
            self.options.plugin_options(self.publication),
        )
        with self.conn.transaction():
            self.conn.execute(
                "SELECT set_config('debug_logical_replication_streaming', %s, true)", (decoding,)
            )
            if work_mem is not None:
                self.conn.execute(
                    "SELECT set_config('logical_decoding_work_mem', %s, true)", (work_mem,)
                )
            with self.conn.cursor(name=f"capture_{self.slot}") as cur:
                cur.itersize = batch
                cur.execute(query, params)
                for lsn, xid, data in cur:
                    yield Captured(Lsn.parse(lsn), int(xid), bytes(data))

    def read(
        self,
        *,
        decoding: DecodingStreaming = "buffered",
        work_mem: str | None = None,
        upto_lsn: int | None = None,
        peek: bool = False,
    ) -> list[Captured]:
        """Everything decodable now (see :meth:`iter_read`), as a list."""
        return list(
            self.iter_read(decoding=decoding, work_mem=work_mem, upto_lsn=upto_lsn, peek=peek)
        )

    def close(self) -> None:
        if self.conn.closed:
            return
        if self._slot_created:
            with contextlib.suppress(psycopg.Error):
                self.conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        self.conn.close()


# -- replication origins ---------------------------------------------------------------


@contextlib.contextmanager
def origin_session(conn: psycopg.Connection[Any], name: str) -> Iterator[None]:
    """Mark the transactions of ``conn`` as replayed from origin ``name``.

    The origin is created (cluster-wide) and dropped afterwards. Inside, call
    :func:`set_origin_lsn` in a transaction to give its commit an origin LSN (what the
    ORIGIN message carries).
    """
    conn.execute("SELECT pg_replication_origin_create(%s)", (name,))
    try:
        conn.execute("SELECT pg_replication_origin_session_setup(%s)", (name,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_replication_origin_session_reset()")
    finally:
        conn.execute("SELECT pg_replication_origin_drop(%s)", (name,))


def set_origin_lsn(conn: psycopg.Connection[Any], lsn: int) -> None:
    """In an open transaction: the origin LSN and time its commit record will carry."""
    conn.execute("SELECT pg_replication_origin_xact_setup(%s::pg_lsn, now())", (str(Lsn(lsn)),))


# -- the representative workload (tests/fixtures/pgoutput_capture.bin) -----------------

REPRESENTATIVE_SCHEMA = """
CREATE SCHEMA app;
CREATE TYPE app.mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN app.posint AS integer CHECK (VALUE > 0);
CREATE TABLE app.items (
    id integer PRIMARY KEY,
    name varchar(20),
    price numeric(12, 2),
    mood app.mood,
    qty app.posint,
    note text
);
ALTER TABLE app.items ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE app.full_t (a integer, b text);
ALTER TABLE app.full_t REPLICA IDENTITY FULL;
CREATE TABLE app.idx_t (a integer NOT NULL, b integer NOT NULL, c text);
CREATE UNIQUE INDEX idx_t_ab ON app.idx_t (a, b);
ALTER TABLE app.idx_t REPLICA IDENTITY USING INDEX idx_t_ab;
CREATE TABLE app.log_t (msg text);
ALTER TABLE app.log_t REPLICA IDENTITY NOTHING;
CREATE TABLE app.parent (id bigserial PRIMARY KEY);
CREATE TABLE app.child (id bigserial PRIMARY KEY, parent_id bigint REFERENCES app.parent);
"""

REPRESENTATIVE_ORIGIN = "sparkapply_capture_origin"
REPRESENTATIVE_ORIGIN_LSN = Lsn.parse("0/ABCDEF")


def representative_workload(dsn: str, *, toast_chars: int = 2500) -> CaptureFile:
    """Every pgoutput message kind, in a few KB, from a fresh database at ``dsn``.

    Two reads of one slot, concatenated: the first decodes with buffered streaming (so
    small transactions are not streamed), the second with immediate streaming (every
    transaction streamed, one segment per change). The header records the facts a test
    checks the decoded messages against (xids, gids, origin, the TOAST value).
    """
    facts: dict[str, Any] = {}
    with connect(dsn) as w, PgoutputCapture(dsn) as cap:
        w.execute(REPRESENTATIVE_SCHEMA)
        cap.setup("FOR TABLES IN SCHEMA app")
        big = secrets.token_urlsafe(toast_chars)[:toast_chars]  # random: does not compress
        facts["toast_value"] = big
        xids: dict[str, int] = {}

        _buffered_transactions(w, xids, big)
        records = cap.read(decoding="buffered")
        facts["buffered_count"] = len(records)

        _streamed_transactions(w, xids)
        records += cap.read(decoding="immediate")
        facts["xids"] = xids
        header = {
            **cap.options.header(),
            "server_version": cap.server_version,
            "description": "tests/pgoutput/capture.py representative_workload: first "
            f"{facts['buffered_count']} records decoded buffered, the rest immediate",
            "origin_name": REPRESENTATIVE_ORIGIN,
            "origin_lsn": int(REPRESENTATIVE_ORIGIN_LSN),
            **facts,
        }
    return CaptureFile(header, records)


def _buffered_transactions(w: psycopg.Connection[Any], xids: dict[str, int], big: str) -> None:
    """Small transactions, decoded without streaming: every change and old-tuple form,
    an origin, messages, truncates and prepared transactions (``xids`` by name)."""
    with w.transaction():  # plain inserts into the four replica-identity kinds
        xids["insert"] = current_xid(w)
        w.execute(
            "INSERT INTO app.items VALUES (1, 'apple', 12.50, 'happy', 3, %s),"
            " (2, NULL, NULL, NULL, NULL, NULL)",
            (big,),
        )
        w.execute("INSERT INTO app.full_t VALUES (1, 'one'), (2, 'two')")
        w.execute("INSERT INTO app.idx_t VALUES (1, 1, 'x')")
        w.execute("INSERT INTO app.log_t VALUES ('hello')")
    with w.transaction():  # updates and deletes with every old-tuple form
        xids["update"] = current_xid(w)
        w.execute("UPDATE app.items SET qty = 4 WHERE id = 1")  # note unchanged: 'u'
        w.execute("UPDATE app.items SET id = 10 WHERE id = 2")  # key change: 'K'
        w.execute("UPDATE app.full_t SET b = 'uno' WHERE a = 1")  # 'O'
        w.execute("UPDATE app.idx_t SET c = 'y'")  # no old tuple
        w.execute("DELETE FROM app.items WHERE id = 10")  # 'K'
        w.execute("DELETE FROM app.full_t WHERE a = 2")  # 'O'
    with origin_session(w, REPRESENTATIVE_ORIGIN), w.transaction():
        xids["origin"] = current_xid(w)
        set_origin_lsn(w, REPRESENTATIVE_ORIGIN_LSN)
        w.execute("INSERT INTO app.log_t VALUES ('from elsewhere')")
    with w.transaction():  # messages, transactional and not
        xids["message"] = current_xid(w)
        w.execute("SELECT pg_logical_emit_message(true, 'sparkapply', 'in a transaction')")
        w.execute("SELECT pg_logical_emit_message(false, 'sparkapply', '\\x00ff'::bytea)")
        w.execute("INSERT INTO app.log_t VALUES ('after the messages')")
    with w.transaction():  # truncates: with both option bits, then with none
        xids["truncate"] = current_xid(w)
        w.execute("INSERT INTO app.parent DEFAULT VALUES")
        w.execute("TRUNCATE app.parent, app.child RESTART IDENTITY CASCADE")
        w.execute("TRUNCATE app.log_t")
    for name, gid, finish in (
        ("prepare_commit", "gid-1", "COMMIT"),
        ("prepare_rollback", "gid-1", "ROLLBACK"),  # the same gid, reused
        ("prepare_empty_gid", "", "COMMIT"),
    ):
        _prepared_transaction(w, xids, name, gid, finish, rows=1)


def _streamed_transactions(w: psycopg.Connection[Any], xids: dict[str, int]) -> None:
    """Transactions decoded with immediate streaming: a subtransaction abort, a top-level
    abort from an origin, and streamed prepared transactions (``xids`` by name)."""
    # Streamed: subtransaction abort, then commit.
    with w.transaction():
        xids["stream_commit"] = current_xid(w)
        w.execute("INSERT INTO app.items (id, name) VALUES (20, 'streamed')")
        w.execute("SAVEPOINT s1")
        w.execute("INSERT INTO app.items (id, name) VALUES (21, 'rolled back')")
        xids["stream_subxact"] = row_xmin(w, "app.items", "id = 21")
        w.execute("ROLLBACK TO SAVEPOINT s1")
        w.execute("INSERT INTO app.items (id, name) VALUES (22, 'kept')")
        # ROLLBACK TO keeps the savepoint: a new subtransaction wrote row 22.
        xids["stream_subxact_2"] = row_xmin(w, "app.items", "id = 22")
        w.execute("SELECT pg_logical_emit_message(true, 'sparkapply', 'in a stream')")
    # Streamed, then aborted at the top level (from an origin: ORIGIN in the stream).
    with origin_session(w, REPRESENTATIVE_ORIGIN):
        w.execute("BEGIN")
        xids["stream_abort"] = current_xid(w)
        w.execute("INSERT INTO app.items (id, name) VALUES (30, 'aborted')")
        w.execute("INSERT INTO app.items (id, name) VALUES (31, 'aborted')")
        w.execute("ROLLBACK")
    # Streamed prepared transactions.
    for name, gid, finish in (
        ("stream_prepare_commit", "gid-s", "COMMIT"),
        ("stream_prepare_rollback", "gid-s", "ROLLBACK"),
    ):
        _prepared_transaction(w, xids, name, gid, finish, rows=2)


def _prepared_transaction(
    w: psycopg.Connection[Any], xids: dict[str, int], name: str, gid: str, finish: str, *, rows: int
) -> None:
    """Insert ``rows`` rows into app.log_t, PREPARE TRANSACTION ``gid``, then ``finish``
    (COMMIT or ROLLBACK) PREPARED; the xid goes into ``xids[name]``."""
    w.execute("BEGIN")
    xids[name] = current_xid(w)
    for _ in range(rows):
        w.execute("INSERT INTO app.log_t VALUES (%s)", (name,))
    w.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    w.execute(sql.SQL(finish + " PREPARED {}").format(sql.Literal(gid)))
