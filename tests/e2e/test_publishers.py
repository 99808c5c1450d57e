"""End to end: what real publishers do in their first week, compared row by row.

Key-less insert-only tables (pgbench's history, audit logs, a deferrable primary key),
a replica identity that changes while the mirror runs (DEFAULT to FULL and back, a key
moved to another column), and keys of every mapped type, alone and composite, folded
by several tasks.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from shutil import which

import psycopg
import pyarrow as pa
import pytest

from sparkapply.run.subscriber import Subscriber
from sparkapply.verify.command import VerifyReport, run_verify
from tests.conftest import PgServer
from tests.mirror import Mirror, Running, copy_snapshots

pytestmark = pytest.mark.integration


def _verified_live(mirror: Mirror) -> VerifyReport:
    """``sparkapply verify`` with the mirror's ``run`` live (it makes the cut); the
    report, which must match."""
    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    try:
        report = run_verify(mirror.config, spark=mirror.spark, timeout=120)
    finally:
        running.stop()
    assert report.match, report.render()
    return report


def _split_over_tasks(mirror: Mirror) -> None:
    """Every keyed table folded by three key-hash partitions, however small."""
    apply = dataclasses.replace(mirror.config.apply, split_bytes=1, max_tasks_per_table=3)
    mirror.config = dataclasses.replace(mirror.config, apply=apply)


def test_keyless_insert_only_tables(mirror: Mirror) -> None:
    """No primary key (pgbench_history), a deferrable primary key (not a replica
    identity in PostgreSQL), and REPLICA IDENTITY NOTHING: mirrored append-only, with
    TRUNCATE and schema changes, copied first and streamed after."""
    mirror.sql(
        "CREATE TABLE history (tid int, bid int, aid int, delta int, mtime timestamp,"
        " filler char(22))",
        "CREATE TABLE audit (id int PRIMARY KEY DEFERRABLE, what text)",
        "CREATE TABLE events (id bigint, payload jsonb)",
        "ALTER TABLE events REPLICA IDENTITY NOTHING",
        "INSERT INTO history SELECT g % 10, g % 3, g, g * 2, now(), 'f'"
        " FROM generate_series(1, 200) g",
        "INSERT INTO audit SELECT g, 'a' || g FROM generate_series(1, 50) g",
        "CREATE PUBLICATION pub FOR TABLE history, audit, events"
        " WITH (publish = 'insert, truncate')",
    )
    mirror.run()  # preflight accepts them; the initial copy
    mirror.assert_mirrored("public.history", "public.audit", "public.events")
    mirror.sql(
        # Duplicate rows are rows of their own in a table without a key.
        "INSERT INTO history SELECT 1, 1, 1, 1, '2026-01-01', 'dup' FROM generate_series(1, 5)",
        "INSERT INTO history SELECT g % 10, g % 3, g, g * 2, now(), 's'"
        " FROM generate_series(1, 3000) g",  # streamed (64kB work_mem)
        "INSERT INTO events SELECT g, jsonb_build_object('n', g) FROM generate_series(1, 100) g",
        "INSERT INTO audit VALUES (51, 'late')",
    )
    mirror.run()
    mirror.assert_mirrored("public.history", "public.audit", "public.events")
    mirror.sql(
        "BEGIN",
        "TRUNCATE events",
        "INSERT INTO events VALUES (7, '{\"after\": true}')",
        "COMMIT",
        "ALTER TABLE history ADD COLUMN note text",
        "INSERT INTO history (tid, bid, aid, delta, note) VALUES (1, 2, 3, 4, 'new col')",
    )
    mirror.run()
    mirror.assert_mirrored("public.history", "public.audit", "public.events")


def test_insert_only_table_gains_an_identity(mirror: Mirror) -> None:
    """An insert-only table without identity becomes REPLICA IDENTITY FULL and its
    publication starts publishing updates: updates apply by row image from then on."""
    mirror.sql(
        "CREATE TABLE log (id int, v text)",
        "CREATE PUBLICATION pub FOR TABLE log WITH (publish = 'insert')",
    )
    mirror.run()
    mirror.sql(
        "INSERT INTO log VALUES (1, 'a'), (2, 'b')",
        "ALTER PUBLICATION pub SET (publish = 'insert, update')",
        "ALTER TABLE log REPLICA IDENTITY FULL",
        "UPDATE log SET v = 'c' WHERE id = 2",
    )
    mirror.run()  # FULL: applied by row image
    mirror.assert_mirrored("public.log")


def test_replica_identity_changes_while_mirroring(mirror: Mirror) -> None:
    """DEFAULT to FULL and back, then the key moved to new columns (a serial id
    replaced by a uuid, the old column dropped), with changes after each move."""
    _split_over_tasks(mirror)
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, code text NOT NULL, v int)",
        "INSERT INTO t SELECT g, 'c' || g, g FROM generate_series(1, 300) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    mirror.sql(
        "UPDATE t SET v = v + 1 WHERE id % 5 = 0",
        "ALTER TABLE t REPLICA IDENTITY FULL",
        "UPDATE t SET v = -v WHERE id % 7 = 0",
        "DELETE FROM t WHERE id % 11 = 0",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
    mirror.sql(
        "ALTER TABLE t REPLICA IDENTITY DEFAULT",
        "UPDATE t SET v = 0 WHERE id % 13 = 0",
        "UPDATE t SET id = id + 1000 WHERE id BETWEEN 1 AND 3",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
    # The key moves to a column that exists and is optional in Iceberg.
    mirror.sql(
        "ALTER TABLE t DROP CONSTRAINT t_pkey",
        "ALTER TABLE t ADD PRIMARY KEY (code)",
        "UPDATE t SET v = 42 WHERE id % 4 = 0",
        "UPDATE t SET code = code || '-x' WHERE id % 9 = 0",
        "DELETE FROM t WHERE id % 17 = 0",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
    # Then to a new uuid column; the old key column is dropped.
    mirror.sql(
        "ALTER TABLE t ADD COLUMN uid uuid",
        "UPDATE t SET uid = md5(code)::uuid",
        "ALTER TABLE t ALTER COLUMN uid SET NOT NULL",
        "ALTER TABLE t DROP CONSTRAINT t_pkey",
        "ALTER TABLE t ADD PRIMARY KEY (uid)",
        "ALTER TABLE t DROP COLUMN id",
        "INSERT INTO t (code, v, uid) SELECT 'n' || g, g, gen_random_uuid()"
        " FROM generate_series(1, 50) g",
        "UPDATE t SET v = v * 2 WHERE v % 3 = 0",
        "DELETE FROM t WHERE v % 10 = 1",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
    # And back to FULL, then to a unique index as identity.
    mirror.sql(
        "ALTER TABLE t REPLICA IDENTITY FULL",
        "UPDATE t SET v = v + 1 WHERE v % 2 = 0",
        "CREATE UNIQUE INDEX t_code ON t (code)",
        "ALTER TABLE t REPLICA IDENTITY USING INDEX t_code",
        "UPDATE t SET code = code || '-y' WHERE v % 5 = 0",
        "DELETE FROM t WHERE v % 7 = 0",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")


# (column type, SQL of the n-th value, SQL of a changed value): one of each key type.
KEY_TYPES = [
    ("int2", "({n})::int2", "({n} + 20000)::int2"),
    ("int4", "{n}", "{n} + 1000000"),
    ("int8", "{n}::int8 * 10000000000", "{n}::int8 * 10000000000 + 1"),
    ("numeric", "{n} / 7.0", "{n} / 7.0 + 0.5"),
    ("numeric(12,3)", "({n} / 3.0)::numeric(12,3)", "({n} / 3.0 + 1000)::numeric(12,3)"),
    ("text", "'k' || {n}", "'moved-' || {n}"),
    ("varchar(20)", "'v' || {n}", "'w' || {n}"),
    ("char(8)", "'c' || {n}", "'d' || {n}"),
    ("uuid", "md5('u' || {n})::uuid", "md5('moved' || {n})::uuid"),
    ("date", "date '2020-01-01' + {n}", "date '2030-01-01' + {n}"),
    (
        "timestamp",
        "timestamp '2020-01-01' + {n} * interval '1 minute'",
        "timestamp '2031-01-01' + {n} * interval '1 second'",
    ),
    (
        "timestamptz",
        "timestamptz '2020-01-01 00:00+02' + {n} * interval '1 hour'",
        "timestamptz '2032-01-01 00:00+05' + {n} * interval '1 hour'",
    ),
    ("bytea", "decode(md5({n}::text), 'hex')", "decode(md5('x' || {n}), 'hex')"),
]


def _key_table(mirror: Mirror, name: str, columns: list[tuple[str, str]], rows: int) -> None:
    cols = ", ".join(f"k{i} {t}" for i, (t, _) in enumerate(columns))
    keys = ", ".join(f"k{i}" for i in range(len(columns)))
    values = ", ".join(v.format(n="g") for _, v in columns)
    mirror.sql(
        f"CREATE TABLE {name} ({cols}, v int, note text, PRIMARY KEY ({keys}))",
        f"INSERT INTO {name} SELECT {values}, g, 'r' || g FROM generate_series(1, {rows}) g",
    )


def _key_changes(mirror: Mirror, name: str, columns: list[tuple[str, str, str]]) -> None:
    """Updates of non-key columns, key changes, deletes, inserts: one transaction each,
    and a key changed twice within one transaction (a chain in one task)."""
    moved = ", ".join(f"k{i} = {c.format(n='v')}" for i, (_, _, c) in enumerate(columns))
    inserted = ", ".join(v.format(n="g") for _, v, _ in columns)
    mirror.sql(
        f"UPDATE {name} SET note = 'u' || v WHERE v % 3 = 0",
        f"UPDATE {name} SET {moved} WHERE v % 10 = 1",
        f"DELETE FROM {name} WHERE v % 10 = 2",
        f"INSERT INTO {name} SELECT {inserted}, g, 'i' FROM generate_series(500, 520) g",
        "BEGIN",
        f"UPDATE {name} SET note = 'twice' WHERE v % 10 = 3",
        f"DELETE FROM {name} WHERE v % 10 = 4",
        f"UPDATE {name} SET v = v + 100000 WHERE v % 10 = 5",
        "COMMIT",
    )


@pytest.mark.parametrize("keytype", [k[0] for k in KEY_TYPES])
def test_single_key_of_every_type(mirror: Mirror, keytype: str) -> None:
    _split_over_tasks(mirror)
    spec = next(k for k in KEY_TYPES if k[0] == keytype)
    _key_table(mirror, "t", [(spec[0], spec[1])], rows=200)
    mirror.sql("CREATE PUBLICATION pub FOR TABLE t")
    mirror.run()
    mirror.assert_mirrored("public.t")
    _key_changes(mirror, "t", [spec])
    mirror.run()
    mirror.assert_mirrored("public.t")


COMPOSITES = {
    "text-timestamptz-uuid": ["text", "timestamptz", "uuid"],
    "int8-uuid": ["int8", "uuid"],
    "date-bytea-int2": ["date", "bytea", "int2"],
    "numeric-char-timestamp": ["numeric(12,3)", "char(8)", "timestamp"],
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_keys(mirror: Mirror, name: str) -> None:
    _split_over_tasks(mirror)
    specs = [next(k for k in KEY_TYPES if k[0] == t) for t in COMPOSITES[name]]
    _key_table(mirror, "t", [(s[0], s[1]) for s in specs], rows=200)
    mirror.sql("CREATE PUBLICATION pub FOR TABLE t")
    mirror.run()
    _key_changes(mirror, "t", specs)
    mirror.run()
    mirror.assert_mirrored("public.t")


@pytest.mark.parametrize("keytype", ["float8", "float4"])
def test_float_keys_compare_as_postgresql_does(mirror: Mirror, keytype: str) -> None:
    """PostgreSQL's float equality has -0 = 0 and NaN = NaN, where the bits differ:
    a key updated from -0 to 0 is the same row moved (found by its old key), a row
    deleted by ``-0`` and inserted as ``0`` in one batch replaces it, and NaN and
    infinite keys are found like any other. Before, the row under -0 stayed beside
    its new version."""
    mirror.sql(
        f"CREATE TABLE f (k {keytype} PRIMARY KEY, v int)",
        "INSERT INTO f VALUES ('-0', 1), ('NaN', 2), ('Infinity', 3), ('-Infinity', 4),"
        " (1.5, 5), (-2.25, 6)",
        f"CREATE TABLE g (k {keytype}, j int, v int, PRIMARY KEY (k, j))",
        "INSERT INTO g VALUES ('-0', 1, 1), ('-0', 2, 2), ('NaN', 1, 3)",
        "CREATE PUBLICATION pub FOR TABLE f, g",
    )
    mirror.run()
    mirror.sql(
        "UPDATE f SET k = 0 WHERE k = '-0'",
        "UPDATE f SET v = v + 10 WHERE k = 'NaN'",
        "DELETE FROM f WHERE k = 'Infinity'",
        "UPDATE f SET k = 'Infinity', v = 7 WHERE k = '-Infinity'",
        "UPDATE g SET k = 0 WHERE j = 1 AND k = '-0'",
        "BEGIN",
        "DELETE FROM g WHERE j = 2",
        "INSERT INTO g VALUES (0, 2, 20)",
        "UPDATE g SET v = 30 WHERE k = 'NaN'",
        "COMMIT",
    )
    mirror.run()
    mirror.assert_mirrored("public.f")
    mirror.assert_mirrored("public.g")
    _, rows = mirror.iceberg_rows("public.f")
    assert len(rows) == 5  # -0/0 once, NaN, Infinity (was -Infinity), 1.5, -2.25


def test_bool_key(mirror: Mirror) -> None:
    """A boolean in a composite key (a flag column next to an id)."""
    _split_over_tasks(mirror)
    mirror.sql(
        "CREATE TABLE t (id int, live bool, v int, PRIMARY KEY (id, live))",
        "INSERT INTO t SELECT g, g % 2 = 0, g FROM generate_series(1, 200) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    mirror.sql(
        "UPDATE t SET v = -v WHERE id % 3 = 0",
        "UPDATE t SET live = NOT live WHERE id % 5 = 0 AND live",
        "DELETE FROM t WHERE id % 7 = 0",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")


@pytest.mark.parametrize(
    "ddl",
    [
        "ALTER TABLE t REPLICA IDENTITY FULL",
        "ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (code)",
    ],
)
def test_identity_changes_between_changes_of_one_transaction(mirror: Mirror, ddl: str) -> None:
    """A migration that writes, changes the identity and writes again, in one
    transaction: each change applies by the identity it was sent with."""
    mirror.sql(
        "CREATE TABLE t (id int PRIMARY KEY, code text NOT NULL, v int)",
        "INSERT INTO t SELECT g, 'c' || g, g FROM generate_series(1, 100) g",
        "CREATE PUBLICATION pub FOR TABLE t",
    )
    mirror.run()
    mirror.sql(
        "BEGIN",
        "UPDATE t SET v = v + 1000 WHERE id % 3 = 0",
        "DELETE FROM t WHERE id % 10 = 0",
        "INSERT INTO t VALUES (500, 'c500', 500)",
        ddl,
        "UPDATE t SET v = -v WHERE id % 2 = 0",
        "DELETE FROM t WHERE id % 7 = 0",
        "UPDATE t SET code = code || '-m' WHERE id % 5 = 0",
        "COMMIT",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")


def _pgbench(pg_server: PgServer) -> str:
    found = str(pg_server.embedded.bin_dir / "pgbench") if pg_server.embedded else which("pgbench")
    assert found, "pgbench is not installed beside the test server"
    return found


def test_pgbench_mirrored_while_it_runs(mirror: Mirror, pg_server: PgServer) -> None:
    """pgbench's own schema (pgbench_history has no key) and its TPC-B-like load, four
    clients, applied while it runs; then every table equals the publisher's."""
    pgbench = _pgbench(pg_server)
    subprocess.run([pgbench, "-i", "-s", "1", "-q", mirror.dsn], check=True, capture_output=True)
    mirror.sql("CREATE PUBLICATION pub FOR ALL TABLES")
    mirror.run()  # the initial copy: 100,000 accounts
    load = subprocess.Popen(
        [pgbench, "-c", "4", "-j", "2", "-t", "400", "-n", mirror.dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        while load.poll() is None:  # batches applied while pgbench writes
            mirror.run()
    finally:
        out, _ = load.communicate(timeout=300)
    assert load.returncode == 0, out.decode()
    mirror.run()
    tables = ("accounts", "branches", "tellers", "history")
    mirror.assert_mirrored(*(f"public.pgbench_{t}" for t in tables))
    assert len(mirror.iceberg_rows("public.pgbench_history")[1]) == 4 * 400


@pytest.mark.parametrize("types", [["uuid"], ["text", "timestamptz", "uuid"]])
def test_uuid_keys_through_compaction(mirror: Mirror, types: list[str]) -> None:
    """A uuid key (alone and in a composite) through batches, a compaction that
    rewrites its files, and more changes located in the compacted files."""
    from sparkapply.maintain.compact import compact

    _split_over_tasks(mirror)
    specs = [next(k for k in KEY_TYPES if k[0] == t) for t in types]
    _key_table(mirror, "t", [(s[0], s[1]) for s in specs], rows=300)
    mirror.sql("CREATE PUBLICATION pub FOR TABLE t")
    mirror.run()
    _key_changes(mirror, "t", specs)
    mirror.run()
    table = mirror.catalog.load_table(("public", "t"))
    compact(table, lambda: mirror.spark, target_file_size=1 << 27, file_delete_ratio=0.01)
    compacted = mirror.catalog.load_table(("public", "t"))
    assert compacted.current_snapshot().summary.operation.value == "replace"
    mirror.assert_mirrored("public.t")
    mirror.sql("UPDATE t SET note = 'after' WHERE v % 4 = 0", "DELETE FROM t WHERE v % 9 = 0")
    mirror.run()
    mirror.assert_mirrored("public.t")


def _mirror_tables(mirror: Mirror) -> set[str]:
    """The mirror's tables, less sparkapply's own (the cuts)."""
    catalog = mirror.catalog
    names = {".".join(t) for ns in catalog.list_namespaces() for t in catalog.list_tables(ns)}
    return {n for n in names if not n.startswith("sparkapply.")}


def test_a_partitioned_table_published_via_its_root(mirror: Mirror) -> None:
    """publish_via_partition_root: the mirror has one table, the root, whichever
    partition a row is in or moves to, a partition created while it runs included.
    pgoutput describes each partition beside the root before a change in it; no
    change names a partition, and no table is made of one."""
    mirror.sql(
        "CREATE TABLE meas (city int, logdate date, peak int, PRIMARY KEY (city, logdate))"
        " PARTITION BY RANGE (logdate)",
        "CREATE TABLE meas_2024 PARTITION OF meas FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
        "CREATE TABLE meas_2025 PARTITION OF meas FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
        "INSERT INTO meas SELECT g, date '2024-01-01' + g, g FROM generate_series(1, 300) g",
        "CREATE PUBLICATION pub FOR TABLE meas WITH (publish_via_partition_root = true)",
    )
    mirror.run()
    mirror.sql(
        "UPDATE meas SET logdate = logdate + 200 WHERE city % 7 = 0",  # to another partition
        "CREATE TABLE meas_2026 PARTITION OF meas FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
        "INSERT INTO meas VALUES (1000, '2026-03-01', 1)",
        "DELETE FROM meas WHERE city % 11 = 0",
        "UPDATE meas SET peak = peak + 1 WHERE city % 5 = 0",
    )
    mirror.run()
    mirror.assert_mirrored("public.meas")
    assert _mirror_tables(mirror) == {"public.meas"}
    mirror.sql("TRUNCATE meas", "INSERT INTO meas VALUES (1, '2025-05-05', 5)")
    mirror.run()
    mirror.assert_mirrored("public.meas")
    assert _mirror_tables(mirror) == {"public.meas"}


def test_lists_of_uuid(mirror: Mirror) -> None:
    """uuid[] columns (lists of pyarrow's uuid extension type, which pyarrow cannot
    make empty or build from Python values directly) on every path: copied, inserted,
    updated by a uuid key and by a composite key with a uuid, an unchanged TOAST value
    filled from the row before (by key, and row by row when the key moves), REPLICA
    IDENTITY FULL, and a table with every row deleted (an empty scan)."""
    many = "(SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 300))"  # TOASTed
    mirror.sql(
        "CREATE TABLE docs (id uuid PRIMARY KEY, line int, refs uuid[], note text)",
        "CREATE TABLE lines (oid uuid, n int, refs uuid[], PRIMARY KEY (oid, n))",
        "CREATE TABLE seen (at int, refs uuid[])",
        "ALTER TABLE seen REPLICA IDENTITY FULL",
        "CREATE TABLE gone (id int PRIMARY KEY, refs uuid[])",
        f"INSERT INTO docs SELECT gen_random_uuid(), g, {many}, 'n' FROM generate_series(1, 20) g",
        "INSERT INTO lines SELECT gen_random_uuid(), g % 3, ARRAY[gen_random_uuid(), NULL]"
        " FROM generate_series(1, 30) g",
        "INSERT INTO seen SELECT g, ARRAY[gen_random_uuid()] FROM generate_series(1, 10) g",
        "INSERT INTO gone VALUES (1, '{}'), (2, NULL)",
        "CREATE PUBLICATION pub FOR TABLE docs, lines, seen, gone",
    )
    mirror.run()
    mirror.assert_mirrored("public.docs", "public.lines", "public.seen", "public.gone")
    mirror.sql(
        "UPDATE docs SET note = 'kept refs' WHERE line <= 10",  # refs unchanged, TOASTed
        "UPDATE docs SET id = gen_random_uuid() WHERE line > 17",  # a moved key, too
        f"INSERT INTO docs SELECT gen_random_uuid(), 100 + g, {many}, 'new'"
        " FROM generate_series(1, 3) g",
        "UPDATE lines SET refs = refs || gen_random_uuid() WHERE n = 1",
        "UPDATE lines SET n = n + 10 WHERE n = 2",
        "UPDATE seen SET at = at + 100 WHERE at <= 3",
        "DELETE FROM seen WHERE at = 5",
        "DELETE FROM gone",
    )
    mirror.run()
    mirror.assert_mirrored("public.docs", "public.lines", "public.seen", "public.gone")
    # verify reads them too (the empty table as an empty scan) and finds them equal.
    report = _verified_live(mirror)
    assert {(t.table, t.iceberg_rows) for t in report.tables} == {
        ("public.docs", 23),
        ("public.lines", 30),
        ("public.seen", 9),
        ("public.gone", 0),
    }


def test_a_table_without_columns(mirror: Mirror) -> None:
    """``CREATE TABLE t ()`` has rows in PostgreSQL, and Iceberg holds no row without a
    value: its rows are left out, by the copy and by the stream alike (the apply of the
    batch's other tables goes on), until it gains a column."""
    mirror.sql(
        "CREATE TABLE nocols ()",
        "INSERT INTO nocols DEFAULT VALUES",
        "CREATE TABLE t (id int PRIMARY KEY, v int)",
        "CREATE PUBLICATION pub FOR TABLE nocols, t",
    )
    mirror.run()
    mirror.sql(
        "BEGIN",
        "INSERT INTO nocols DEFAULT VALUES",
        "INSERT INTO t VALUES (1, 1)",
        "COMMIT",
    )
    mirror.run()
    mirror.assert_mirrored("public.t")
    assert mirror.iceberg_rows("public.nocols")[1] == []
    mirror.sql("ALTER TABLE nocols ADD COLUMN c int", "INSERT INTO nocols VALUES (7)")
    mirror.run()
    assert mirror.iceberg_rows("public.nocols") == (["c"], [(7,)])


def test_a_column_added_to_the_column_list(
    mirror: Mirror, caplog: pytest.LogCaptureFixture
) -> None:
    """A column added to a publication's column list arrives in the next RELATION, and
    PostgreSQL sends nothing for the rows it already had. The column existed when the
    table was copied (its number is at or below the one recorded then), so its older
    rows may hold values: the table is copied again, and they read as on the
    publisher. (Before, they read null until changed or resynced.)"""
    mirror.sql(
        "CREATE TABLE cl (id int PRIMARY KEY, a text, b text)",
        "INSERT INTO cl SELECT g, 'a' || g, 'b' || g FROM generate_series(1, 30) g",
        "CREATE PUBLICATION pub FOR TABLE cl (id, a)",
    )
    mirror.run()
    assert mirror.iceberg_rows("public.cl")[0] == ["id", "a"]
    mirror.sql(
        "ALTER PUBLICATION pub SET TABLE cl (id, a, b)",
        "UPDATE cl SET a = 'changed' WHERE id <= 10",
    )
    with caplog.at_level("INFO", logger="sparkapply.copy.driver"):
        mirror.run()
    assert "public.cl: column(s) b arrive with values" in caplog.text
    _, rows = mirror.iceberg_rows("public.cl")
    by_id = {r[0]: r for r in rows}
    assert by_id[5] == (5, "changed", "b5") and by_id[20] == (20, "a20", "b20")
    mirror.assert_mirrored("public.cl")


def test_columns_added_with_values_copy_the_table_again(
    mirror: Mirror, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """``ADD COLUMN ... DEFAULT`` gives the rows already there a value PostgreSQL never
    replicates: a fast default it keeps for older rows, a volatile default that
    rewrites the table, an identity. Such a column makes the table be copied again
    before the batch that brings it; a plain ADD COLUMN (null in older rows on the
    publisher too) does not, nor does a restart. A column renamed, or dropped and
    added again under its name, is copied too (the mirror's values were another
    column's). A kill after the copy evolved the table, before it committed, still
    copies it at the next start: the intent is recorded first."""
    mirror.sql(
        "CREATE TABLE mig (id int PRIMARY KEY, v text)",
        "INSERT INTO mig SELECT g, 'v' || g FROM generate_series(1, 40) g",
        "CREATE TABLE plain (id int PRIMARY KEY, v text)",
        "INSERT INTO plain SELECT g, 'p' || g FROM generate_series(1, 40) g",
        "CREATE TABLE later (id int PRIMARY KEY)",
        "INSERT INTO later SELECT generate_series(1, 10)",
        "CREATE PUBLICATION pub FOR TABLE mig, plain, later",
    )
    mirror.run()
    mirror.sql(
        "ALTER TABLE mig ADD COLUMN active boolean NOT NULL DEFAULT true",
        "ALTER TABLE mig ADD COLUMN born timestamptz DEFAULT clock_timestamp()",
        "ALTER TABLE mig ADD COLUMN n int GENERATED ALWAYS AS IDENTITY",
        "UPDATE mig SET v = 'changed' WHERE id <= 5",
        "INSERT INTO mig (id, v, active) VALUES (100, 'new', false)",
        "ALTER TABLE plain ADD COLUMN note text",
        "UPDATE plain SET note = 'noted' WHERE id <= 5",
    )
    with caplog.at_level("INFO"):
        mirror.run()
    assert "public.mig: column(s) active, born, n arrive with values" in caplog.text
    copies = [r.getMessage() for r in caplog.records if "copy again" in r.getMessage()]
    assert copies and all("public.plain" not in c for c in copies), copies
    # The note on rows left null is the stream's, not the copy's (which fills them).
    assert "public.plain: column(s) note added, with no default; its 40" in caplog.text
    assert "public.mig: column(s) active, born, n added, with no default" not in caplog.text
    _, rows = mirror.iceberg_rows("public.mig")
    assert all(r[2] is True for r in rows if r[0] != 100), "older rows hold the default"
    mirror.assert_mirrored("public.mig", "public.plain")

    # A column renamed, one dropped and added again under its name: the mirror's values
    # were the old column's (or none). Then a restart with nothing new copies nothing.
    copied_before = len(copy_snapshots(mirror, "public.plain"))
    mirror.sql(
        "ALTER TABLE plain RENAME COLUMN v TO w",
        "UPDATE plain SET w = 'renamed' WHERE id = 1",
    )
    mirror.run()
    mirror.assert_mirrored("public.plain")
    mirror.sql(
        "ALTER TABLE plain DROP COLUMN note",
        "ALTER TABLE plain ADD COLUMN note text",
        "UPDATE plain SET note = 'again' WHERE id = 2",
    )
    mirror.run()
    mirror.assert_mirrored("public.plain")
    assert len(copy_snapshots(mirror, "public.plain")) == copied_before + 2
    mirror.sql("UPDATE plain SET w = 'restarted' WHERE id = 3", "UPDATE mig SET v = 'r'")
    mirror.run()
    assert len(copy_snapshots(mirror, "public.plain")) == copied_before + 2
    assert len(copy_snapshots(mirror, "public.mig")) == 2
    mirror.assert_mirrored("public.plain", "public.mig")

    mirror.sql(
        "ALTER TABLE later ADD COLUMN flag int DEFAULT 7", "INSERT INTO later VALUES (11, 1)"
    )
    mirror.run_killed("copy-before-commit", tmp_path)
    later = mirror.catalog.load_table("public.later")
    assert "flag" in {f.name for f in later.schema().fields}, "the kill came after the evolve"
    assert later.properties.get("sparkapply.copy-again") == "column(s) flag arrived with values"
    mirror.run()
    mirror.assert_mirrored("public.later")
    assert "sparkapply.copy-again" not in mirror.catalog.load_table("public.later").properties


def _catalog_checkers(mirror: Mirror) -> set[int]:
    """Backends of this database that sparkapply's copy driver holds."""
    with psycopg.connect(mirror.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'sparkapply-copy-driver'"
        ).fetchall()
    return {int(pid) for (pid,) in rows}


def test_relations_are_checked_on_one_kept_connection(mirror: Mirror) -> None:
    """A batch that brings a RELATION has its columns compared with the catalog (see
    the test above) on a connection the session keeps, not on one of its own: three
    such batches, one backend. One the server ended is replaced at the next batch,
    which applies as it should (here a column with values: the table is copied
    again); the session's end closes it."""
    mirror.sql(
        "CREATE TABLE kc (id int PRIMARY KEY, v text)",
        "INSERT INTO kc SELECT g, 'v' || g FROM generate_series(1, 20) g",
        "CREATE PUBLICATION pub FOR TABLE kc",
    )
    mirror.run()
    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    try:
        seen = []
        for n in range(3):
            mirror.sql(f"ALTER TABLE kc ADD COLUMN c{n} int", f"UPDATE kc SET c{n} = id")
            running.wait_flushed(mirror.insert_lsn())
            seen.append(_catalog_checkers(mirror))
        assert len(seen[0]) == 1 and seen[0] == seen[1] == seen[2], seen
        mirror.sql(f"SELECT pg_terminate_backend({next(iter(seen[0]))})")
        mirror.sql(
            "ALTER TABLE kc ADD COLUMN c3 int NOT NULL DEFAULT 7",
            "UPDATE kc SET v = 'after' WHERE id = 1",
        )
        running.wait_flushed(mirror.insert_lsn())
        replaced = _catalog_checkers(mirror)
        assert len(replaced) == 1 and replaced != seen[0], (seen[0], replaced)
    finally:
        running.stop()
    assert not _catalog_checkers(mirror), "the session's end closes the kept connection"
    _, rows = mirror.iceberg_rows("public.kc")
    assert {r[-1] for r in rows} == {7}, "the older rows hold the default: copied again"
    mirror.assert_mirrored("public.kc")


def test_a_table_dropped_and_created_again(mirror: Mirror) -> None:
    """PostgreSQL replicates neither DROP TABLE nor CREATE TABLE: a table created
    again under its old name is a new relation, empty, with a new OID (and maybe other
    column types). Its first RELATION, or the next start, finds the OID is not the one
    copied, and the table is copied again, replacing the old rows. Before, the old
    rows stayed beside the new table's. Both ways: while the run is live, and while it
    was stopped."""
    mirror.sql(
        "CREATE TABLE d (id int PRIMARY KEY, v text)",
        "INSERT INTO d SELECT g, 'old' || g FROM generate_series(1, 20) g",
        "CREATE TABLE keep (id int PRIMARY KEY)",
        "INSERT INTO keep VALUES (1)",
        "CREATE PUBLICATION pub FOR ALL TABLES",
    )
    mirror.run()
    running = Running(Subscriber(mirror.config, spark=mirror.spark, catalog=mirror.catalog))
    try:
        mirror.sql(
            "UPDATE d SET v = 'last of the old' WHERE id = 1",
            "DROP TABLE d",
            "CREATE TABLE d (id int PRIMARY KEY, v int)",  # v: text -> int
            "INSERT INTO d VALUES (100, 1), (101, 2)",
            "INSERT INTO keep VALUES (2)",
        )
        mirror.sql("UPDATE d SET v = v + 10 WHERE id = 100", "INSERT INTO keep VALUES (3)")
        running.wait_flushed(mirror.insert_lsn())
    finally:
        running.stop()
    mirror.assert_mirrored("public.d", "public.keep")
    # Stopped meanwhile: found at the next start.
    mirror.sql(
        "DROP TABLE d",
        "CREATE TABLE d (id int PRIMARY KEY, v int)",
        "INSERT INTO d VALUES (7, 7)",
    )
    mirror.run()
    mirror.assert_mirrored("public.d", "public.keep")
    mirror.sql("UPDATE d SET v = 8", "INSERT INTO d VALUES (9, 9)")
    mirror.run()
    mirror.assert_mirrored("public.d")


@pytest.mark.parametrize("encoding", ["LATIN1", "SQL_ASCII"])
def test_a_database_not_in_utf8(
    pg_server: PgServer, tmp_path: Path, spark: object, encoding: str
) -> None:
    """A database in LATIN1 (converted to UTF-8 for us by the server) or SQL_ASCII
    (bytes as stored: UTF-8 from a UTF-8 application). Copy, stream and verify read
    it as UTF-8; before, a SQL_ASCII database stopped the run (a connection left at the
    server's encoding returned bytes), and verify could not hash either."""
    name = pg_server.create_database("enc", encoding=encoding)
    try:
        mirror = Mirror(pg_server.dsn(name), tmp_path / "work", spark)
        mirror.sql(
            "CREATE TYPE mood AS ENUM ('ça va', 'größer')",
            "CREATE TABLE e (id int PRIMARY KEY, t text, c char(4), m mood, j jsonb)",
            "INSERT INTO e VALUES (1, 'café Größe ÿ', 'ñ', 'ça va', '{\"é\": \"£\"}'),"
            " (2, repeat('é', 5000), 'a', 'größer', NULL)",
            "CREATE PUBLICATION pub FOR TABLE e",
        )
        mirror.run()
        mirror.sql(
            "INSERT INTO e VALUES (3, 'naïve £', 'ü', 'größer', '[\"ß\"]')",
            "UPDATE e SET t = t || '¤', m = 'größer' WHERE id = 1",
            "UPDATE e SET c = 'é' WHERE id = 2",  # t unchanged: TOASTed, not sent
        )
        mirror.run()
        mirror.assert_mirrored("public.e")
        _, rows = mirror.iceberg_rows("public.e")
        assert {r[0]: r[1] for r in rows}[1] == "café Größe ÿ¤"
        _verified_live(mirror)
    finally:
        pg_server.drop_database(name)


def test_verify_refuses_a_multibyte_encoding_it_cannot_hash(pg_server: PgServer) -> None:
    """EUC_JP cannot hold UTF-8's bytes as text: verify says so (exit 2's error)
    instead of failing halfway through a table."""
    from sparkapply.errors import SourceError
    from sparkapply.source.connection import connect
    from sparkapply.verify.publisher import check_hash

    name = pg_server.create_database("enc", encoding="EUC_JP")
    try:
        with connect(pg_server.dsn(name)) as conn, pytest.raises(SourceError) as caught:
            check_hash(conn)
        assert "multibyte encoding EUC_JP" in str(caught.value)
    finally:
        pg_server.drop_database(name)


def _arrays_stored_as(mirror: Mirror, table: str) -> dict[str, str]:
    """How the mirror holds each of the table's array columns: "text" or "list"."""
    types = mirror.iceberg_types(table)
    return {
        c: "text" if pa.types.is_large_string(types[c]) else "list"
        for c in mirror.pg_array_columns(table)
    }


def test_arrays_of_more_than_one_dimension(mirror: Mirror) -> None:
    """An Iceberg list has one depth; a PostgreSQL array column may hold any. A column
    declared with more than one dimension is mirrored as the array's text, copied and
    streamed (an unchanged TOASTed matrix filled from the row before, a FULL identity
    row found by its matrix), and so is one added while streaming; one declared with
    one dimension is a list, and a matrix in it stops the run with the way on: declare
    the dimensions, resync. A text column altered to an array is a column replaced."""
    from sparkapply.commands.resync import resync
    from sparkapply.errors import ConversionError

    # 2,000 x 2 random ints: TOASTed out of line (compression cannot keep it inline).
    big = "(SELECT array_agg(ARRAY[g, (random() * 1e9)::int]) FROM generate_series(1, 2000) g)"
    mirror.sql(
        "CREATE TABLE grid (id int PRIMARY KEY, m int[][], t text[][], v int[], note text)",
        "INSERT INTO grid VALUES (1, '{{1,2},{3,4}}', '{{\"a b\",NULL},{c,\"d,e\"}}', '{1,2}',"
        " 'n'), (2, '{5,6}', '{}', NULL, 'n'), (3, '[0:1][1:2]={{1,2},{3,4}}', NULL, '{}', 'n')",
        f"INSERT INTO grid VALUES (4, {big}, NULL, NULL, 'big')",
        "CREATE TABLE seen (m float8[][][], n int)",
        "ALTER TABLE seen REPLICA IDENTITY FULL",
        "INSERT INTO seen VALUES ('{{{1.5,NaN}},{{-0,Infinity}}}', 1), ('{{1}}', 2), (NULL, 3)",
        "CREATE TABLE flat (id int PRIMARY KEY, v int[])",
        "INSERT INTO flat VALUES (1, '{1,2}')",
        "CREATE PUBLICATION pub FOR TABLE grid, seen, flat",
    )
    mirror.run()
    assert _arrays_stored_as(mirror, "public.grid") == {"m": "text", "t": "text", "v": "list"}
    assert _arrays_stored_as(mirror, "public.seen") == {"m": "text"}
    mirror.assert_mirrored("public.grid", "public.seen", "public.flat")
    mirror.sql(
        "INSERT INTO grid VALUES (5, '{{{1}},{{2}}}', '{{x}}', '{3}', 'n')",
        "UPDATE grid SET m = m || ARRAY[[9, 9]] WHERE id = 1",
        "UPDATE grid SET note = 'kept' WHERE id = 4",  # m unchanged and TOASTed
        "UPDATE grid SET id = 40, note = 'moved' WHERE id = 4",  # ... and the key moves
        "UPDATE seen SET n = n + 10 WHERE m = '{{{1.5,NaN}},{{-0,Infinity}}}'",
        "DELETE FROM seen WHERE n = 2",
    )
    mirror.run()
    mirror.assert_mirrored("public.grid", "public.seen")
    _, rows = mirror.iceberg_rows("public.grid")
    assert {r[0]: r[1] for r in rows}[1] == "{{1,2},{3,4},{9,9}}"
    # Columns added while streaming: the publisher's catalog says their dimensions.
    mirror.sql(
        "ALTER TABLE grid ADD COLUMN cube numeric[][][], ADD COLUMN row_ int[]",
        "INSERT INTO grid VALUES (6, NULL, NULL, NULL, 'n', '{{{1.5}},{{2}}}', '{1}')",
        "UPDATE grid SET cube = '{{{0}}}', row_ = '{}' WHERE id = 1",
    )
    mirror.run()
    stored = _arrays_stored_as(mirror, "public.grid")
    assert stored["cube"] == "text" and stored["row_"] == "list"
    mirror.assert_mirrored("public.grid")

    mirror.sql("INSERT INTO flat VALUES (2, '{{1,2},{3,4}}')")
    with pytest.raises(ConversionError) as info:
        mirror.run()
    assert "multi-dimensional" in str(info.value) and "flat" in str(info.value)
    assert info.value.context.get("column") == "v"
    assert "resync" in (info.value.hint or "")
    mirror.sql("ALTER TABLE flat ALTER COLUMN v TYPE int[][]")  # no rewrite
    resync(mirror.config, "public.flat", spark=mirror.spark, catalog=mirror.catalog)
    mirror.sql("UPDATE flat SET v = '{{5}}' WHERE id = 1", "INSERT INTO flat VALUES (3, '{4}')")
    mirror.run()
    assert _arrays_stored_as(mirror, "public.flat") == {"v": "text"}
    # A text column that becomes an array (one dimension) is a type change Iceberg
    # cannot widen: the rows the ALTER rewrote are not replicated, so the run copies
    # the table again, the column replaced by a list.
    mirror.sql("ALTER TABLE grid ALTER COLUMN note TYPE text[] USING ARRAY[note, 'x']")
    mirror.sql("UPDATE grid SET note = '{y}' WHERE id = 2")
    mirror.run()
    stored = _arrays_stored_as(mirror, "public.grid")
    assert stored["note"] == "list" and stored["m"] == "text"
    mirror.assert_mirrored("public.grid", "public.seen", "public.flat")
    _verified_live(mirror)
