"""The decoder against real bytes: every pgoutput message kind, captured from the server.

Each test runs a workload in a fresh database, captures what the real ``pgoutput``
plugin emits for it (``tests/pgoutput/capture.py``, SQL interface, protocol 4,
``streaming 'parallel'``, ``two_phase 'on'``, ``messages 'true'``) and checks every
decoded field against what the workload knows: xids read in the writing session, LSNs
read before and after a statement, server clock readings around the workload, OIDs
from the catalog.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql

from sparkapply.lsn import Lsn
from sparkapply.pgoutput import Decoder
from sparkapply.pgoutput import messages as m
from tests.pgoutput.capture import (
    Captured,
    CaptureOptions,
    PgoutputCapture,
    StreamingOption,
    connect,
    current_lsn,
    current_xid,
    origin_session,
    read_capture,
    representative_workload,
    row_xmin,
    set_origin_lsn,
)
from tests.pgoutput.test_capture_fixture import FIXTURE, check_representative

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
INT4, INT8, TEXT, VARCHAR, NUMERIC, TIMESTAMPTZ = 23, 20, 25, 1043, 1700, 1184
T = TypeVar("T")

# -- helpers ---------------------------------------------------------------------------


def decode(
    records: Sequence[Captured], streaming: str = "parallel", proto_version: int = 4
) -> list[m.Message]:
    """Decode in order with one Decoder, as one replication session would."""
    dec = Decoder(proto_version=proto_version, streaming=streaming)
    return [dec.decode(r.payload) for r in records]


def of(msgs: Sequence[m.Message], cls: type[T]) -> list[T]:
    return [x for x in msgs if isinstance(x, cls)]


def one(msgs: Sequence[m.Message], cls: type[T]) -> T:
    found = of(msgs, cls)
    assert len(found) == 1, f"expected one {cls.__name__}, got {len(found)}: {found}"
    return found[0]


def kinds(msgs: Sequence[m.Message]) -> list[str]:
    return [type(x).__name__ for x in msgs]


def server_clock(conn: psycopg.Connection[Any]) -> int:
    """The server's clock now, in microseconds since the PostgreSQL epoch."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return int((row[0] - PG_EPOCH) / timedelta(microseconds=1))


def oid(conn: psycopg.Connection[Any], expr: str) -> int:
    row = conn.execute(f"SELECT {expr}::oid::bigint").fetchone()
    assert row is not None
    return int(row[0])


def tup(*values: bytes | None, kinds: bytes | None = None) -> m.TupleData:
    """Expected TupleData: text values, ``None`` for NULL (or ``kinds`` given; a 'u'
    column's value is UNCHANGED)."""
    if kinds is None:
        kinds = bytes(m.KIND_NULL if v is None else m.KIND_TEXT for v in values)
    return m.TupleData(
        kinds,
        tuple(
            m.UNCHANGED if k == m.KIND_UNCHANGED else v for k, v in zip(kinds, values, strict=True)
        ),
    )


def split_transactions(msgs: Sequence[m.Message]) -> Iterator[list[m.Message]]:
    """Begin..Commit and BeginPrepare..Prepare groups, in order."""
    cur: list[m.Message] | None = None
    for x in msgs:
        if isinstance(x, m.Begin | m.BeginPrepare):
            assert cur is None, "transaction started inside a transaction"
            cur = [x]
        elif cur is not None:
            cur.append(x)
            if isinstance(x, m.Commit | m.Prepare):
                yield cur
                cur = None
    assert cur is None, "unterminated transaction"


def stream_segments(msgs: Sequence[m.Message]) -> list[list[m.Message]]:
    """Stream Start .. Stream Stop groups, each including both ends."""
    segs: list[list[m.Message]] = []
    cur: list[m.Message] | None = None
    for x in msgs:
        if isinstance(x, m.StreamStart):
            assert cur is None, "Stream Start inside a stream segment"
            cur = [x]
        elif cur is not None:
            cur.append(x)
            if isinstance(x, m.StreamStop):
                segs.append(cur)
                cur = None
    assert cur is None, "unterminated stream segment"
    return segs


# -- Begin / Commit / Relation / Insert ------------------------------------------------


def test_begin_commit_xids_lsns_and_times(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cap.setup()
        t0 = server_clock(w)
        xids, bounds = [], []
        for i in range(3):
            before = current_lsn(w)
            with w.transaction():
                xids.append(current_xid(w))
                w.execute("INSERT INTO t VALUES (%s, 'x'), (%s, 'y')", (2 * i, 2 * i + 1))
            bounds.append((before, current_lsn(w)))
        t1 = server_clock(w)
        records = cap.read()
    msgs = decode(records)
    assert (
        kinds(msgs)
        == ["Begin", "Relation", "Insert", "Insert", "Commit"]
        + [
            "Begin",
            "Insert",
            "Insert",
            "Commit",
        ]
        * 2
    )
    txns = list(split_transactions(msgs))
    assert len(txns) == 3
    prev_end = 0
    for txn, xid, (before, after) in zip(txns, xids, bounds, strict=True):
        begin, commit = txn[0], txn[-1]
        assert isinstance(begin, m.Begin) and isinstance(commit, m.Commit)
        assert begin.xid == xid
        assert begin.final_lsn == commit.commit_lsn
        assert before < commit.commit_lsn < commit.end_lsn <= after
        assert commit.commit_lsn > prev_end
        prev_end = commit.end_lsn
        assert commit.flags == 0
        assert begin.commit_time == commit.commit_time
        assert t0 <= commit.commit_time <= t1
    # The SQL interface reports the commit at its end LSN, the changes before it.
    commits = of(msgs, m.Commit)
    assert [r.lsn for r in records if r.tag == "C"] == [c.end_lsn for c in commits]
    assert [r.xid for r in records if r.tag == "B"] == xids
    inserts = of(msgs, m.Insert)
    assert [i.new for i in inserts] == [
        tup(str(k).encode(), b"xy"[k % 2 : k % 2 + 1]) for k in range(6)
    ]
    assert all(i.xid is None for i in inserts)


def test_relation_identities_columns_and_types(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute(
            """
            CREATE SCHEMA "My Schema";
            CREATE TABLE "My Schema"."Items" (
                id int PRIMARY KEY, name varchar(20), price numeric(12, 2),
                ts timestamptz, dropped int, big bigint,
                gen int GENERATED ALWAYS AS (id * 2) STORED);
            ALTER TABLE "My Schema"."Items" DROP COLUMN dropped;
            CREATE TABLE full_t (a int, b text);
            ALTER TABLE full_t REPLICA IDENTITY FULL;
            CREATE TABLE idx_t (a int NOT NULL, b text, c int NOT NULL);
            CREATE UNIQUE INDEX idx_t_ca ON idx_t (c, a);
            ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_ca;
            CREATE TABLE nothing_t (a int PRIMARY KEY, b text);
            ALTER TABLE nothing_t REPLICA IDENTITY NOTHING;
            """
        )
        cap.setup()
        with w.transaction():
            w.execute(
                """INSERT INTO "My Schema"."Items" VALUES (1, 'a', 1.5, now(), 5);
                INSERT INTO full_t VALUES (1, 'a');
                INSERT INTO idx_t VALUES (1, 'b', 2);
                INSERT INTO nothing_t VALUES (1, 'c');"""
            )
        rel_oids = {
            name: oid(w, f"'{name}'::regclass")
            for name in ('"My Schema"."Items"', "full_t", "idx_t", "nothing_t")
        }
        msgs = decode(cap.read())
    rels = of(msgs, m.Relation)
    assert [r.relation_id for r in rels] == list(rel_oids.values())
    assert [(r.namespace, r.name, r.replica_identity) for r in rels] == [
        ("My Schema", "Items", "d"),
        ("public", "full_t", "f"),
        ("public", "idx_t", "i"),
        ("public", "nothing_t", "n"),
    ]
    assert all(r.xid is None for r in rels)
    col = m.RelationColumn
    # The dropped and the generated column are not published (PostgreSQL 16).
    assert rels[0].columns == (
        col(1, "id", INT4, -1),
        col(0, "name", VARCHAR, 20 + 4),
        col(0, "price", NUMERIC, ((12 << 16) | 2) + 4),
        col(0, "ts", TIMESTAMPTZ, -1),
        col(0, "big", INT8, -1),
    )
    assert [c.is_key for c in rels[0].columns] == [True, False, False, False, False]
    # REPLICA IDENTITY FULL flags every column as key.
    assert rels[1].columns == (col(1, "a", INT4, -1), col(1, "b", TEXT, -1))
    # USING INDEX flags the index columns, whatever their order in the index.
    assert rels[2].columns == (col(1, "a", INT4, -1), col(0, "b", TEXT, -1), col(1, "c", INT4, -1))
    # NOTHING flags none, not even the primary key.
    assert rels[3].columns == (col(0, "a", INT4, -1), col(0, "b", TEXT, -1))
    # Each relation's first change comes right after its Relation message.
    for rel in rels:
        i = msgs.index(rel)
        ins = msgs[i + 1]
        assert isinstance(ins, m.Insert) and ins.relation_id == rel.relation_id
        assert len(ins.new) == len(rel.columns)
    first = msgs[msgs.index(rels[0]) + 1]
    assert isinstance(first, m.Insert)
    assert first.new.kinds == b"ttttt"
    assert first.new.values[:3] == (b"1", b"a", b"1.50") and first.new.values[4] == b"5"


def test_type_messages_for_enum_and_domain(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute(
            """
            CREATE SCHEMA app;
            CREATE TYPE app.mood AS ENUM ('sad', 'ok', 'happy');
            CREATE DOMAIN app.posint AS integer CHECK (VALUE > 0);
            CREATE TABLE app.t (id int PRIMARY KEY, m app.mood, q app.posint, n text);
            """
        )
        cap.setup()
        w.execute("INSERT INTO app.t VALUES (1, 'happy', 7, 'x'), (2, NULL, NULL, NULL)")
        mood, posint = oid(w, "'app.mood'::regtype"), oid(w, "'app.posint'::regtype")
        msgs = decode(cap.read())
    assert kinds(msgs) == ["Begin", "Type", "Type", "Relation", "Insert", "Insert", "Commit"]
    enum_t, domain_t = of(msgs, m.Type)
    assert enum_t == m.Type(None, mood, "app", "mood")
    # pgoutput describes a domain by its base type's namespace and name (pg_catalog = "").
    assert domain_t == m.Type(None, posint, "", "int4")
    rel = one(msgs, m.Relation)
    assert [(c.name, c.type_oid) for c in rel.columns] == [
        ("id", INT4),
        ("m", mood),
        ("q", posint),
        ("n", TEXT),
    ]
    first, second = of(msgs, m.Insert)
    assert first.new == tup(b"1", b"happy", b"7", b"x")
    assert second.new == tup(b"2", None, None, None)
    assert second.new.is_null(1) and not second.new.is_unchanged(1)


# -- Update / Delete / TOAST -----------------------------------------------------------


def test_update_delete_old_tuples_and_unchanged_toast(pg_dsn: str) -> None:
    big = secrets.token_urlsafe(4000)[:4000]  # random: pglz cannot shrink it, so it is toasted
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute(
            """
            CREATE TABLE d (id int PRIMARY KEY, n int, note text);
            CREATE TABLE f (a int, b text);
            ALTER TABLE f REPLICA IDENTITY FULL;
            """
        )
        w.execute("INSERT INTO d VALUES (1, 0, %s), (2, 0, 'small')", (big,))
        w.execute("INSERT INTO f VALUES (1, 'one'), (2, 'two'), (2, 'two')")
        d_oid = oid(w, "'d'::regclass")
        toast = sql.Identifier(f"pg_toast_{d_oid}")
        row = w.execute(sql.SQL("SELECT count(*) FROM pg_toast.{}").format(toast)).fetchone()
        assert row is not None and row[0] > 0, "precondition: the big value is out of line"
        cap.setup()
        with w.transaction():
            w.execute("UPDATE d SET n = 1 WHERE id = 1")  # note toasted, unchanged: 'u'
            w.execute("UPDATE d SET id = 3 WHERE id = 2")  # key change: old key 'K'
            w.execute("UPDATE d SET note = %s WHERE id = 1", (big[::-1],))  # toast changed
            w.execute("UPDATE f SET b = 'uno' WHERE a = 1")  # FULL: old row 'O'
            w.execute("DELETE FROM d WHERE id = 3")  # 'K'
            w.execute("DELETE FROM f WHERE a = 1")  # 'O'
            w.execute("UPDATE d SET id = 4, n = 2 WHERE id = 1")  # key change + toast kept
        msgs = decode(cap.read())
    assert kinds(msgs) == [
        "Begin",
        "Relation",
        "Update",
        "Update",
        "Update",
        "Relation",
        "Update",
        "Delete",
        "Delete",
        "Update",
        "Commit",
    ]
    rel_d, rel_f = of(msgs, m.Relation)
    u_toast, u_key, u_big, u_full, u_key_toast = of(msgs, m.Update)
    d_key, d_full = of(msgs, m.Delete)
    assert {u.relation_id for u in (u_toast, u_key, u_big, u_key_toast)} == {rel_d.relation_id}
    assert u_full.relation_id == d_full.relation_id == rel_f.relation_id
    assert d_key.relation_id == rel_d.relation_id

    assert u_toast.old_kind is None and u_toast.old is None
    assert u_toast.new == tup(b"1", b"1", None, kinds=b"ttu")
    assert u_toast.new.is_unchanged(2) and not u_toast.new.is_null(2)

    # The old key image carries the key columns; the others are sent as NULL.
    assert u_key.old_kind == "K"
    assert u_key.old == tup(b"2", None, None)
    assert u_key.new == tup(b"3", b"0", b"small")

    assert u_big.old is None
    assert u_big.new == tup(b"1", b"1", big[::-1].encode())

    assert u_full.old_kind == "O"
    assert u_full.old == tup(b"1", b"one")
    assert u_full.new == tup(b"1", b"uno")

    assert d_key.old_kind == "K" and d_key.old == tup(b"3", None, None)
    assert d_full.old_kind == "O" and d_full.old == tup(b"1", b"uno")

    # A key change of a row whose toasted value is kept: old key, and 'u' in the new row.
    assert u_key_toast.old_kind == "K" and u_key_toast.old == tup(b"1", None, None)
    assert u_key_toast.new == tup(b"4", b"2", None, kinds=b"ttu")


def test_binary_mode_tuples(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn, options=CaptureOptions(binary=True)) as cap:
        w.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n bigint)")
        cap.setup()
        w.execute("INSERT INTO t VALUES (42, 'héllo', NULL)")
        msgs = decode(cap.read())
    ins = one(msgs, m.Insert)
    assert ins.new == tup((42).to_bytes(4, "big"), "héllo".encode(), None, kinds=b"bbn")


def test_wide_rows_big_values_and_unicode_names(pg_dsn: str) -> None:
    """1,000 columns, a 1 MB value (decoded from bytes and from a memoryview, which the
    decoder walks in place when large) and non-ASCII identifiers, prefixes and gids."""
    big = secrets.token_hex(500_000)  # 1 MB of text
    cols = ", ".join(f"c{i} int" for i in range(1000))
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute(f'CREATE SCHEMA "Ünïcødé"; CREATE TABLE "Ünïcødé"."tåble" ("çøl" text, {cols})')
        w.execute('ALTER TABLE "Ünïcødé"."tåble" REPLICA IDENTITY FULL')
        cap.setup()
        w.execute(
            f'INSERT INTO "Ünïcødé"."tåble" VALUES (%s, {", ".join(["1"] * 999)}, NULL)', (big,)
        )
        w.execute("SELECT pg_logical_emit_message(false, 'préfixe', 'contenu')")
        w.execute("BEGIN")
        xid = current_xid(w)
        w.execute('UPDATE "Ünïcødé"."tåble" SET c0 = 2')
        w.execute("PREPARE TRANSACTION 'gïd ✓'")
        w.execute("COMMIT PREPARED 'gïd ✓'")
        records = cap.read(work_mem="64MB")  # not streamed
    msgs = decode(records)
    assert kinds(msgs) == [
        *["Begin", "Relation", "Insert", "Commit", "LogicalMessage"],
        *["BeginPrepare", "Update", "Prepare", "CommitPrepared"],
    ]
    rel = one(msgs, m.Relation)
    assert (rel.namespace, rel.name, len(rel.columns)) == ("Ünïcødé", "tåble", 1001)
    assert rel.columns[0] == m.RelationColumn(1, "çøl", TEXT, -1)
    assert rel.columns[-1] == m.RelationColumn(1, "c999", INT4, -1)
    ins = one(msgs, m.Insert)
    assert len(ins.new) == 1001
    assert ins.new.kinds == b"t" * 1000 + b"n"
    assert ins.new.values[0] == big.encode() and ins.new.values[1:4] == (b"1", b"1", b"1")
    payload = next(r.payload for r in records if r.tag == "I")
    assert len(payload) > 1_000_000
    as_view = Decoder(proto_version=4, streaming="parallel").decode(memoryview(payload))
    assert as_view == ins
    assert isinstance(as_view, m.Insert) and type(as_view.new.values[0]) is bytes
    upd = one(msgs, m.Update)
    assert upd.old_kind == "O" and upd.old == ins.new  # the old row in full, detoasted
    assert upd.new.kinds[:2] == b"ut" and upd.new.values[1] == b"2"  # big value unchanged
    assert one(msgs, m.LogicalMessage).prefix == "préfixe"
    assert (one(msgs, m.BeginPrepare).gid, one(msgs, m.CommitPrepared).gid) == ("gïd ✓",) * 2
    assert one(msgs, m.BeginPrepare).xid == xid


# -- Truncate / Message / Origin -------------------------------------------------------


def test_truncate_options_and_relations(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute(
            """
            CREATE TABLE parent (id bigserial PRIMARY KEY);
            CREATE TABLE child (id bigserial PRIMARY KEY, p bigint REFERENCES parent);
            CREATE TABLE solo (id int);
            CREATE TABLE unpublished (id int);
            """
        )
        cap.setup("FOR TABLE parent, child, solo")
        w.execute("INSERT INTO parent DEFAULT VALUES")
        with w.transaction():
            w.execute("TRUNCATE parent, child, unpublished RESTART IDENTITY CASCADE")
            w.execute("TRUNCATE solo")
        w.execute("TRUNCATE parent CASCADE")  # child is truncated by the cascade
        parent, child, solo = (oid(w, f"'{t}'::regclass") for t in ("parent", "child", "solo"))
        msgs = decode(cap.read())
    truncs = of(msgs, m.Truncate)
    assert [(t.options, t.relation_ids) for t in truncs] == [
        (m.TRUNCATE_CASCADE | m.TRUNCATE_RESTART_IDENTITY, (parent, child)),
        (0, (solo,)),
        (m.TRUNCATE_CASCADE, (parent, child)),
    ]
    assert truncs[0].cascade and truncs[0].restart_identity
    assert not truncs[1].cascade and not truncs[1].restart_identity
    assert truncs[2].cascade and not truncs[2].restart_identity
    assert all(t.xid is None for t in truncs)
    # Every truncated relation was described (Relation) before, in its transaction.
    for txn in split_transactions(msgs):
        described: set[int] = set()
        for x in txn:
            if isinstance(x, m.Relation):
                described.add(x.relation_id)
            elif isinstance(x, m.Truncate):
                assert set(x.relation_ids) <= described


def test_logical_messages(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TABLE t (id int)")
        cap.setup()
        with w.transaction():
            xid = current_xid(w)
            tx_lsn = w.execute(
                "SELECT pg_logical_emit_message(true, 'sparkapply/tx', 'in a transaction')::text"
            ).fetchone()
            nt_lsn = w.execute(
                "SELECT pg_logical_emit_message(false, 'ßpfx', '\\x00ff00'::bytea)::text"
            ).fetchone()
            w.execute("INSERT INTO t VALUES (1)")
        w.execute("BEGIN")
        lost_lsn = w.execute(
            "SELECT pg_logical_emit_message(false, 'p', 'survives the rollback')::text"
        ).fetchone()
        w.execute("SELECT pg_logical_emit_message(true, 'p', 'lost with the rollback')")
        w.execute("ROLLBACK")
        assert tx_lsn and nt_lsn and lost_lsn
        msgs = decode(cap.read())
    # A non-transactional message is sent when decoded, outside any transaction.
    assert kinds(msgs) == [
        "LogicalMessage",
        "Begin",
        "LogicalMessage",
        "Relation",
        "Insert",
        "Commit",
        "LogicalMessage",
    ]
    nt, tx, lost = of(msgs, m.LogicalMessage)
    begin = one(msgs, m.Begin)
    assert begin.xid == xid
    assert tx == m.LogicalMessage(
        None, 1, Lsn.parse(tx_lsn[0]), "sparkapply/tx", b"in a transaction"
    )
    assert tx.transactional
    assert nt == m.LogicalMessage(None, 0, Lsn.parse(nt_lsn[0]), "ßpfx", b"\x00\xff\x00")
    assert not nt.transactional
    assert lost == m.LogicalMessage(None, 0, Lsn.parse(lost_lsn[0]), "p", b"survives the rollback")


def test_origin_messages(pg_dsn: str) -> None:
    origin = f"sparkapply_test_{secrets.token_hex(4)}"
    with (
        connect(pg_dsn) as w,
        PgoutputCapture(pg_dsn) as cap,
        PgoutputCapture(
            pg_dsn, slot="no_origin", publication="no_origin", options=CaptureOptions(origin="none")
        ) as cap_none,
    ):
        w.execute("CREATE TABLE t (id int)")
        cap.setup()
        cap_none.setup()
        w.execute("INSERT INTO t VALUES (0)")
        with origin_session(w, origin):
            with w.transaction():
                xid = current_xid(w)
                set_origin_lsn(w, 0x16_B374D848)
                w.execute("INSERT INTO t VALUES (1)")
            w.execute("BEGIN")
            pxid = current_xid(w)
            set_origin_lsn(w, 0x17_00000000)
            w.execute("INSERT INTO t VALUES (2)")
            w.execute("PREPARE TRANSACTION 'from origin'")
            w.execute("COMMIT PREPARED 'from origin'")
            with w.transaction():  # the origin LSN sticks to the session: reset it
                set_origin_lsn(w, 0)
                w.execute("INSERT INTO t VALUES (3)")
        msgs = decode(cap.read())
        msgs_none = decode(cap_none.read())
    txns = list(split_transactions(msgs))
    assert [kinds(t) for t in txns] == [
        ["Begin", "Relation", "Insert", "Commit"],
        ["Begin", "Origin", "Insert", "Commit"],
        ["BeginPrepare", "Origin", "Insert", "Prepare"],
        ["Begin", "Origin", "Insert", "Commit"],
    ]
    begin, begin_prepare = txns[1][0], txns[2][0]
    assert isinstance(begin, m.Begin) and begin.xid == xid
    assert isinstance(begin_prepare, m.BeginPrepare) and begin_prepare.xid == pxid
    assert txns[1][1] == m.Origin(0x16_B374D848, origin)
    assert txns[2][1] == m.Origin(0x17_00000000, origin)
    assert txns[3][1] == m.Origin(0, origin)
    assert kinds(msgs)[-1] == "Commit" and kinds(msgs).count("CommitPrepared") == 1
    # origin 'none': only the local transaction is sent.
    assert kinds(msgs_none) == ["Begin", "Relation", "Insert", "Commit"]
    assert one(msgs_none, m.Insert).new == tup(b"0")


# -- Streaming -------------------------------------------------------------------------


def test_streamed_commit_with_subtransaction_aborts(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute(
            """
            CREATE TYPE mood AS ENUM ('sad', 'happy');
            CREATE TABLE t (id int PRIMARY KEY, m mood);
            CREATE TABLE side (id int);
            """
        )
        cap.setup()
        t0 = server_clock(w)
        with w.transaction():
            top = current_xid(w)
            w.execute("INSERT INTO t VALUES (1, 'happy')")
            w.execute("SAVEPOINT a")
            # NULL moods: see test_stream_abort_of_a_subtransaction_never_streamed.
            w.execute("INSERT INTO t VALUES (2, NULL)")
            sub_a = row_xmin(w, "t", "id = 2")
            w.execute("SAVEPOINT b")
            w.execute("INSERT INTO t VALUES (3, NULL)")
            sub_b = row_xmin(w, "t", "id = 3")
            before_abort = current_lsn(w)
            w.execute("ROLLBACK TO SAVEPOINT a")  # aborts b, then a; a starts again (a2)
            after_abort = current_lsn(w)
            w.execute("SAVEPOINT c")
            w.execute("INSERT INTO t VALUES (4, 'happy')")
            sub_c = row_xmin(w, "t", "id = 4")
            w.execute("RELEASE SAVEPOINT c")
            w.execute("TRUNCATE side")
            msg_lsn = w.execute("SELECT pg_logical_emit_message(true, 'p', 'c')::text").fetchone()
            w.execute("INSERT INTO t VALUES (5, 'sad')")
            sub_a2 = row_xmin(w, "t", "id = 5")
        t1 = server_clock(w)
        assert msg_lsn is not None
        assert len({top, sub_a, sub_b, sub_c, sub_a2}) == 5
        records = cap.read(decoding="immediate")
    msgs = decode(records)
    assert not of(msgs, m.Begin) and not of(msgs, m.Commit)
    segments = stream_segments(msgs)
    in_stream = [x for seg in segments for x in seg]
    outside = [x for x in msgs if not any(x is y for y in in_stream)]
    assert kinds(outside) == ["StreamAbort", "StreamAbort", "StreamCommit"]

    starts = of(msgs, m.StreamStart)
    assert len(segments) == len(starts) == len(of(msgs, m.StreamStop)) >= 5
    assert [s.first_segment for s in starts] == [True] + [False] * (len(starts) - 1)
    assert {s.xid for s in starts} == {top}

    # Each change carries the xid of the (sub)transaction that made it.
    inserts = of(msgs, m.Insert)
    assert [(i.new.values[0], i.xid) for i in inserts] == [
        (b"1", top),
        (b"2", sub_a),
        (b"3", sub_b),
        (b"4", sub_c),
        (b"5", sub_a2),
    ]
    for x in in_stream:
        if isinstance(x, m.Relation | m.Type):
            assert x.xid in (top, sub_a, sub_b, sub_c, sub_a2)
    assert of(msgs, m.Type)[0].xid == top
    trunc = one(msgs, m.Truncate)
    assert trunc.xid == sub_a2 and trunc.options == 0
    # A transactional message is attributed to the top transaction.
    msg = one(msgs, m.LogicalMessage)
    assert msg == m.LogicalMessage(top, 1, Lsn.parse(msg_lsn[0]), "p", b"c")

    abort_b, abort_a = of(msgs, m.StreamAbort)
    commit = one(msgs, m.StreamCommit)
    assert (abort_b.xid, abort_b.subxid) == (top, sub_b)
    assert (abort_a.xid, abort_a.subxid) == (top, sub_a)
    for ab in (abort_b, abort_a):
        assert ab.abort_lsn is not None and ab.abort_time is not None
        assert before_abort < ab.abort_lsn <= after_abort
        assert t0 <= ab.abort_time <= commit.commit_time
    assert abort_b.abort_lsn is not None and abort_a.abort_lsn is not None
    assert abort_b.abort_lsn < abort_a.abort_lsn
    assert commit.xid == top and commit.flags == 0
    assert after_abort < commit.commit_lsn < commit.end_lsn
    assert t0 <= commit.commit_time <= t1


def test_stream_abort_of_a_subtransaction_never_streamed(pg_dsn: str) -> None:
    """PostgreSQL skips changes of a subtransaction that is already aborted when decoding
    needs a catalog lookup for them (here: the output function of an enum label not yet
    cached), leaving an empty segment; its Stream Abort still comes. Subscribers must
    accept empty segments and aborts of subxids they never saw."""
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        w.execute("CREATE TABLE t (id int PRIMARY KEY, m mood)")
        cap.setup()
        with w.transaction():
            top = current_xid(w)
            w.execute("INSERT INTO t VALUES (1, 'happy')")
            w.execute("SAVEPOINT a")
            w.execute("INSERT INTO t VALUES (2, 'sad')")
            sub = row_xmin(w, "t", "id = 2")
            w.execute("ROLLBACK TO SAVEPOINT a")
        msgs = decode(cap.read(decoding="immediate"))
    assert kinds(msgs) == [
        *["StreamStart", "Type", "Relation", "Insert", "StreamStop"],
        *["StreamStart", "StreamStop"],
        *["StreamAbort", "StreamCommit"],
    ]
    assert one(msgs, m.Insert).xid == top
    assert of(msgs, m.StreamStart)[1] == m.StreamStart(top, False)
    abort = one(msgs, m.StreamAbort)
    assert (abort.xid, abort.subxid) == (top, sub)


def test_streamed_large_transactions_commit_and_abort(pg_dsn: str) -> None:
    """Streamed because they pass logical_decoding_work_mem (64kB), not by the debug GUC."""
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cap.setup()
        w.execute("INSERT INTO t VALUES (0, 'small')")  # not streamed
        with w.transaction():
            big_xid = current_xid(w)
            w.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g")
        w.execute("BEGIN")
        aborted_xid = current_xid(w)
        w.execute("UPDATE t SET v = 'y' WHERE id > 0")
        before = current_lsn(w)
        w.execute("ROLLBACK")
        after = current_lsn(w)
        msgs = decode(cap.read(decoding="buffered", work_mem="64kB"))
    begin = one(msgs, m.Begin)
    assert begin.xid not in (big_xid, aborted_xid)
    assert kinds(msgs)[:5] == ["Begin", "Relation", "Insert", "Commit", "StreamStart"]
    starts = of(msgs, m.StreamStart)
    by_xid: dict[int, list[m.StreamStart]] = {}
    for s in starts:
        by_xid.setdefault(s.xid, []).append(s)
    assert set(by_xid) == {big_xid, aborted_xid}
    for segs in by_xid.values():
        assert len(segs) >= 2
        assert [s.first_segment for s in segs] == [True] + [False] * (len(segs) - 1)
    inserts = [x for x in of(msgs, m.Insert) if x.xid is not None]
    assert len(inserts) == 2000 and {i.xid for i in inserts} == {big_xid}
    updates = of(msgs, m.Update)
    assert updates and {u.xid for u in updates} == {aborted_xid}
    commit = one(msgs, m.StreamCommit)
    assert commit.xid == big_xid
    abort = one(msgs, m.StreamAbort)
    assert (abort.xid, abort.subxid) == (aborted_xid, aborted_xid)
    assert abort.abort_lsn is not None and before < abort.abort_lsn <= after
    assert abort.abort_time is not None and abort.abort_time >= commit.commit_time
    assert isinstance(msgs[-1], m.StreamAbort)


def test_stream_abort_without_parallel_has_no_abort_lsn(pg_dsn: str) -> None:
    """With streaming 'on' the same abort is 9 bytes shorter: no LSN, no time."""
    with (
        connect(pg_dsn) as w,
        PgoutputCapture(pg_dsn, options=CaptureOptions(streaming="on")) as cap,
    ):
        w.execute("CREATE TABLE t (id int)")
        cap.setup()
        w.execute("BEGIN")
        xid = current_xid(w)
        w.execute("INSERT INTO t VALUES (1)")
        w.execute("ROLLBACK")
        records = cap.read(decoding="immediate")
    assert [len(r.payload) for r in records if r.tag == "A"] == [9]
    abort = one(decode(records, streaming="on"), m.StreamAbort)
    assert abort == m.StreamAbort(xid, xid, None, None)


# -- Two-phase -------------------------------------------------------------------------


def _prepare(w: psycopg.Connection[Any], gid: str, value: int) -> int:
    w.execute("BEGIN")
    xid = current_xid(w)
    w.execute("INSERT INTO t VALUES (%s)", (value,))
    w.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    return xid


def _finish(w: psycopg.Connection[Any], how: str, gid: str) -> None:
    w.execute(sql.SQL(how + " PREPARED {}").format(sql.Literal(gid)))


def test_two_phase_commit_rollback_reused_and_empty_gid(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TABLE t (id int)")
        cap.setup()
        t0 = server_clock(w)
        x1 = _prepare(w, "gid-1", 1)
        _finish(w, "COMMIT", "gid-1")
        x2 = _prepare(w, "gid-1", 2)  # the same gid again
        _finish(w, "ROLLBACK", "gid-1")
        x3 = _prepare(w, "", 3)  # PostgreSQL allows an empty gid
        x4 = _prepare(w, "other", 4)  # prepared while '' still is
        _finish(w, "ROLLBACK", "")
        _finish(w, "COMMIT", "other")
        t1 = server_clock(w)
        msgs = decode(cap.read())
    assert kinds(msgs) == [
        *["BeginPrepare", "Relation", "Insert", "Prepare", "CommitPrepared"],
        *["BeginPrepare", "Insert", "Prepare", "RollbackPrepared"],
        *["BeginPrepare", "Insert", "Prepare"],
        *["BeginPrepare", "Insert", "Prepare", "RollbackPrepared", "CommitPrepared"],
    ]
    bps, ps = of(msgs, m.BeginPrepare), of(msgs, m.Prepare)
    assert [(b.xid, b.gid) for b in bps] == [(x1, "gid-1"), (x2, "gid-1"), (x3, ""), (x4, "other")]
    for b, p in zip(bps, ps, strict=True):
        assert (b.prepare_lsn, b.end_lsn, b.prepare_time, b.xid, b.gid) == (
            p.prepare_lsn,
            p.end_lsn,
            p.prepare_time,
            p.xid,
            p.gid,
        )
        assert p.flags == 0 and p.prepare_lsn < p.end_lsn
        assert t0 <= p.prepare_time <= t1
    assert [i.new for i in of(msgs, m.Insert)] == [tup(b"1"), tup(b"2"), tup(b"3"), tup(b"4")]
    cp1, cp4 = of(msgs, m.CommitPrepared)
    rp2, rp3 = of(msgs, m.RollbackPrepared)
    assert (cp1.xid, cp1.gid, cp1.flags) == (x1, "gid-1", 0)
    assert ps[0].end_lsn <= cp1.commit_lsn < cp1.end_lsn
    assert ps[0].prepare_time <= cp1.commit_time <= t1
    assert (cp4.xid, cp4.gid) == (x4, "other")
    assert cp4.commit_lsn >= rp3.rollback_end_lsn
    assert (rp2.xid, rp2.gid, rp2.flags) == (x2, "gid-1", 0)
    assert (rp3.xid, rp3.gid) == (x3, "")
    for rp, p in ((rp2, ps[1]), (rp3, ps[2])):
        assert rp.prepare_end_lsn == p.end_lsn
        assert rp.prepare_time == p.prepare_time
        assert rp.rollback_end_lsn > rp.prepare_end_lsn
        assert p.prepare_time <= rp.rollback_time <= t1
    # xids ascend with gids repeating: the xid, not the gid, names a prepared transaction.
    assert x1 < x2 < x3 < x4


def test_stream_prepare(pg_dsn: str) -> None:
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn) as cap:
        w.execute("CREATE TABLE t (id int)")
        cap.setup()
        x1 = _prepare(w, "sp", 1)
        w.execute("INSERT INTO t VALUES (10)")  # a plain transaction in between
        _finish(w, "COMMIT", "sp")
        x2 = _prepare(w, "sp", 2)
        _finish(w, "ROLLBACK", "sp")
        msgs = decode(cap.read(decoding="immediate"))
    assert kinds(msgs) == [
        "StreamStart",
        "Relation",
        "Insert",
        "StreamStop",
        "StreamPrepare",
        "StreamStart",
        "Relation",
        "Insert",
        "StreamStop",
        "StreamCommit",
        "CommitPrepared",
        "StreamStart",
        "Relation",
        "Insert",
        "StreamStop",
        "StreamPrepare",
        "RollbackPrepared",
    ]
    sp1, sp2 = of(msgs, m.StreamPrepare)
    s1, s_plain, s2 = of(msgs, m.StreamStart)
    assert (s1.xid, s1.first_segment, s2.xid, s2.first_segment) == (x1, True, x2, True)
    assert s_plain.xid not in (x1, x2)
    assert [(i.xid, i.new) for i in of(msgs, m.Insert)] == [
        (x1, tup(b"1")),
        (s_plain.xid, tup(b"10")),
        (x2, tup(b"2")),
    ]
    assert (sp1.xid, sp1.gid, sp1.flags) == (x1, "sp", 0)
    assert (sp2.xid, sp2.gid) == (x2, "sp")
    assert sp1.prepare_lsn < sp1.end_lsn < sp2.prepare_lsn < sp2.end_lsn
    cp, rp = one(msgs, m.CommitPrepared), one(msgs, m.RollbackPrepared)
    assert (cp.xid, cp.gid) == (x1, "sp") and cp.commit_lsn >= sp1.end_lsn
    assert (rp.xid, rp.gid) == (x2, "sp")
    assert (rp.prepare_end_lsn, rp.prepare_time) == (sp2.end_lsn, sp2.prepare_time)


# -- Older protocol versions -----------------------------------------------------------


@pytest.mark.parametrize(
    ("proto_version", "streaming", "two_phase"),
    [(1, "off", False), (2, "on", False), (3, "on", True), (4, "on", True)],
)
def test_older_protocols(
    pg_dsn: str, proto_version: int, streaming: StreamingOption, two_phase: bool
) -> None:
    options = CaptureOptions(proto_version=proto_version, streaming=streaming, two_phase=two_phase)
    with connect(pg_dsn) as w, PgoutputCapture(pg_dsn, options=options) as cap:
        w.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cap.setup()
        with w.transaction():
            xid = current_xid(w)
            w.execute("INSERT INTO t VALUES (1, 'a')")
            w.execute("SAVEPOINT s")
            w.execute("INSERT INTO t VALUES (2, 'b')")
            sub = row_xmin(w, "t", "id = 2")
            w.execute("ROLLBACK TO SAVEPOINT s")
            w.execute("SELECT pg_logical_emit_message(true, 'p', 'x')")
        prepared = _prepare(w, "g", 3) if two_phase else None
        if two_phase:
            _finish(w, "COMMIT", "g")
        records = cap.read(decoding="immediate")
    msgs = decode(records, streaming, proto_version)
    if streaming == "off":
        assert kinds(msgs) == ["Begin", "Relation", "Insert", "LogicalMessage", "Commit"]
        assert one(msgs, m.Begin).xid == xid
        assert one(msgs, m.LogicalMessage).xid is None
        return
    outside = [x for x in msgs if isinstance(x, m.StreamAbort | m.StreamCommit | m.StreamPrepare)]
    expected = ["StreamAbort", "StreamCommit"] + (["StreamPrepare"] if two_phase else [])
    assert kinds(outside) == expected
    abort = one(msgs, m.StreamAbort)
    assert abort == m.StreamAbort(xid, sub, None, None)  # no abort LSN/time before 'parallel'
    assert one(msgs, m.StreamCommit).xid == xid
    assert [i.xid for i in of(msgs, m.Insert)] == [xid, sub] + ([prepared] if prepared else [])
    if prepared is not None:
        assert (one(msgs, m.StreamPrepare).gid, one(msgs, m.CommitPrepared).xid) == ("g", prepared)


# -- The saved fixture -----------------------------------------------------------------


def test_representative_workload_matches_saved_fixture(pg_dsn: str) -> None:
    """The workload of tests/fixtures/pgoutput_capture.bin still produces that shape."""
    live = representative_workload(pg_dsn)
    live_msgs = decode(live.records, live.header["streaming"])
    check_representative(live.header, live_msgs)
    saved = read_capture(FIXTURE)
    saved_msgs = decode(saved.records, saved.header["streaming"])
    assert kinds(live_msgs) == kinds(saved_msgs)
    assert [r.tag for r in live.records] == [r.tag for r in saved.records]
