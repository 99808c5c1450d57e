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

from psycopg import sql

from sparkapply.lsn import Lsn
from sparkapply.pgoutput import Decoder
from sparkapply.pgoutput import messages as m
from tests.pgoutput.capture import (
    CaptureOptions,
    PgoutputCapture,
    connect,
    current_lsn,
    current_xid,
    origin_session,
    set_origin_lsn,
)
from tests.pgoutput.golden import (
    INT4,
    INT8,
    NUMERIC,
    TEXT,
    TIMESTAMPTZ,
    VARCHAR,
    decode,
    kinds,
    of,
    oid,
    one,
    server_clock,
    split_transactions,
    tup,
)

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
        *["Begin", "Relation", "Update", "Update", "Update"],
        *["Relation", "Update", "Delete", "Delete", "Update", "Commit"],
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
        *["Begin", "LogicalMessage", "Relation", "Insert", "Commit"],
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
