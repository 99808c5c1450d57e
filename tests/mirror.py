"""Test support for end-to-end runs: run the subscriber, compare Iceberg to PostgreSQL,
and the independent readers (DuckDB, iceberg-rust, Java Iceberg) to pyiceberg.

Comparison is row by row over the publisher's current columns, after normalising
each side's Python values to one comparable form (the documented type mapping:
json/jsonb (compared as text)/unconstrained numeric/user types are text in Iceberg, NaN is NaN).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from psycopg.types.string import TextLoader
from pyiceberg.table import Table

from sparkapply.config import Config, load_config
from sparkapply.lsn import Lsn
from sparkapply.run.batch import BatchStats
from sparkapply.run.subscriber import RunSummary, Subscriber
from tests.java_reader import JdbcCatalog, jdbc_catalog, shared_java_reader
from tests.readers import AT_SNAPSHOT, READERS, Readers, can_read, conform
from tests.spec_check import assert_spec_conformant


def slot_for(dsn: str) -> str:
    """One slot name per test database: slots are cluster-wide, tests must not share."""
    return "s_" + str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def make_config(dsn: str, work_dir: Path, publication: str = "pub", **source: Any) -> Config:
    slot = str(source.pop("slot", slot_for(dsn)))
    return load_config(
        None,
        env={},
        overrides={
            "work_dir": str(work_dir),
            "source": {"dsn": dsn, "publication": publication, "slot": slot, **source},
            "sink": {
                "catalog": {
                    "type": "sql",
                    # Expanded by the config, escaped as each spelling needs.
                    "uri": "sqlite:///{work_dir}/catalog.db",
                    "warehouse": "file://{work_dir}/warehouse",
                }
            },
            # Every batch a Spark job, as big ones and a cluster's are: the default
            # folds small batches on the driver, which the command-line tests, the
            # demo and the random workload's "driver" mode run.
            "apply": {"batch_linger": 0.2, "driver_fold_bytes": 0},
        },
    )


class Mirror:
    """One subscriber configuration against one test database."""

    def __init__(self, dsn: str, work_dir: Path, spark: Any, **source: Any) -> None:
        self.dsn = dsn
        self.config = make_config(dsn, work_dir, **source)
        self.slot = self.config.source.slot
        self.spark = spark
        self.catalog: Any = None

    def run(
        self, deadline: float = 240.0, on_batch: Callable[[BatchStats], None] | None = None
    ) -> RunSummary:
        """Replicate until caught up; a run that does not finish in ``deadline`` s is
        stopped and fails the test (a hang must not eat the CI budget)."""
        sub = Subscriber(self.config, spark=self.spark, catalog=self.catalog, on_batch=on_batch)
        outcome: list[RunSummary | BaseException] = []

        def target() -> None:
            try:
                outcome.append(sub.run(until_caught_up=True))
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=target, name="mirror-run", daemon=True)
        thread.start()
        thread.join(deadline)
        if thread.is_alive():
            sub.stop()
            thread.join(60)
            raise AssertionError(
                f"the subscriber did not catch up within {deadline:.0f} s "
                f"({sub.summary.reconnects} reconnects, flushed to {sub.summary.flushed})"
            )
        self.catalog = sub.catalog
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def write_config(self, path: Path, *, atomic_commit: bool = True, **apply: object) -> Path:
        """This mirror's configuration as a TOML file, for the command line."""
        c = self.config
        props = c.sink.catalog
        extra = "".join(f"{k} = {v}\n" for k, v in apply.items())
        path.write_text(
            f"work_dir = {_toml_string(str(c.work_dir))}\n"
            f'[source]\ndsn = "{c.source.dsn}"\npublication = "pub"\nslot = "{self.slot}"\n'
            f"[sink]\natomic_commit = {str(atomic_commit).lower()}\n"
            f'[sink.catalog]\ntype = "sql"\nuri = "{props["uri"]}"\n'
            f'warehouse = "{props["warehouse"]}"\n'
            f'[spark]\nmaster = "local[1]"\n[apply]\nbatch_linger = 0.1\n{extra}'
        )
        return path

    def run_killed(
        self, failpoint: str, config_dir: Path, *, atomic_commit: bool = True, **apply: object
    ) -> None:
        """Run ``sparkapply run --until-caught-up`` in a child process armed with
        ``failpoint``, and check that it died by SIGKILL there."""
        cfg = self.write_config(config_dir / "crash.toml", atomic_commit=atomic_commit, **apply)
        killed(failpoint, "run", "--config", str(cfg), "--until-caught-up")

    def sql(self, *statements: str, autocommit: bool = True) -> None:
        with psycopg.connect(self.dsn, autocommit=autocommit, client_encoding="UTF8") as conn:
            for s in statements:
                conn.execute(s)

    def insert_lsn(self) -> Lsn:
        """The publisher's WAL insert position now."""
        return Lsn.parse(self._one("SELECT pg_current_wal_insert_lsn()::text"))

    def confirmed_lsn(self) -> str:
        """The slot's ``confirmed_flush_lsn``: what the subscriber has acknowledged."""
        return self._one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot,),
        )

    def _one(self, query: str, params: tuple[object, ...] = ()) -> str:
        with psycopg.connect(self.dsn, autocommit=True, client_encoding="UTF8") as conn:
            row = conn.execute(query, params).fetchone()
        assert row is not None
        return str(row[0])

    def jdbc_catalog(self) -> JdbcCatalog:
        """The mirror's SQL catalog as Iceberg's Java JdbcCatalog reads it."""
        config = self.config
        return jdbc_catalog(config.sink.catalog_name, config.catalog_properties())

    def iceberg_table(self, table: str) -> Table:
        ns, name = table.split(".")
        loaded: Table = self.catalog.load_table((ns, name))
        return loaded

    def iceberg_rows(self, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        from sparkapply.sink.read import read_table

        arrow = read_table(self.iceberg_table(table))
        return arrow.column_names, [tuple(r.values()) for r in arrow.to_pylist()]

    def iceberg_types(self, table: str) -> dict[str, pa.DataType]:
        from sparkapply.datafiles import arrow_schema_of

        schema = arrow_schema_of(self.iceberg_table(table))
        return {f.name: f.type for f in schema}

    def pg_rows(
        self, table: str, text_columns: Collection[str] = ()
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The publisher's rows; ``text_columns`` are read as their text."""
        source = sql.Identifier(*table.split("."))
        with psycopg.connect(self.dsn, client_encoding="UTF8") as conn:
            # json/jsonb stay text, as Iceberg stores them.
            for json_type in ("json", "jsonb"):
                conn.adapters.register_loader(json_type, TextLoader)
            head = conn.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(source))
            cols = [d.name for d in head.description or []]
            select = sql.SQL(", ").join(
                sql.SQL("{}::text").format(sql.Identifier(c))
                if c in text_columns
                else sql.Identifier(c)
                for c in cols
            )
            cur = conn.execute(sql.SQL("SELECT {} FROM {}").format(select, source))
            return cols, list(cur.fetchall())

    def pg_array_columns(self, table: str) -> set[str]:
        """The table's array columns on the publisher."""
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT a.attname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
                "AND t.typcategory = 'A'",
                (sql.Identifier(*table.split(".")).as_string(conn),),
            ).fetchall()
        return {str(r[0]) for r in rows}

    def assert_mirrored(self, *tables: str, readers: Readers | None = None) -> None:
        """Each table reads in pyiceberg as the publisher's rows, and reads the same in
        DuckDB, iceberg-rust and Java Iceberg as in pyiceberg (all at one snapshot),
        through ``readers`` or through readers opened for this call; and its files are
        the spec's (:func:`tests.spec_check.assert_spec_conformant`)."""
        from sparkapply.sink.read import read_table

        with contextlib.ExitStack() as stack:
            if readers is None:
                readers = stack.enter_context(Readers())
            for table in tables:
                iceberg = self.iceberg_table(table)
                arrow = read_table(iceberg)
                self._assert_equals_postgres(table, arrow)
                assert_readers_agree(table, iceberg, arrow, readers)
                assert_spec_conformant(iceberg)

    def _assert_equals_postgres(self, table: str, arrow: pa.Table) -> None:
        ice_types = self.iceberg_types(table)
        # Arrays the mirror holds as text (user types, more than one dimension).
        as_text = {
            c
            for c in self.pg_array_columns(table)
            if c in ice_types and pa.types.is_large_string(ice_types[c])
        }
        pg_cols, pg = self.pg_rows(table, as_text)
        ice_cols = arrow.column_names
        ice = [tuple(r.values()) for r in arrow.to_pylist()]
        missing = [c for c in pg_cols if c not in ice_cols]
        assert not missing, f"{table}: columns {missing} missing in Iceberg"
        idx = [ice_cols.index(c) for c in pg_cols]
        # Documented: NaN in a numeric(p,s) column is stored as null.
        nan_to_null = [pa.types.is_decimal(ice_types[c]) for c in pg_cols]
        pg = [
            tuple(
                None if n and isinstance(v, decimal.Decimal) and v.is_nan() else v
                for v, n in zip(r, nan_to_null, strict=True)
            )
            for r in pg
        ]
        left = sorted((_row(r) for r in pg), key=repr)
        right = sorted((_row(tuple(r[i] for i in idx)) for r in ice), key=repr)
        assert len(left) == len(right), f"{table}: {len(left)} rows in PG, {len(right)} in Iceberg"
        for a, b in zip(left, right, strict=True):
            assert a == b, f"{table}: row differs\n  postgres: {a}\n  iceberg:  {b}"


def copy_snapshots(mirror: Mirror, table: str) -> list[dict[str, str]]:
    """The summaries of the snapshots of ``table`` a copy committed (the initial copy,
    each copy again, each resync)."""
    ns, name = table.split(".")
    t = mirror.catalog.load_table((ns, name))
    return [
        dict(s.summary.additional_properties)
        for s in t.snapshots()
        if s.summary is not None and "sparkapply.copy-lsn" in s.summary.additional_properties
    ]


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m sparkapply *args`` in a child process, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "sparkapply", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def killed(failpoint: str, *args: str) -> None:
    """Run ``sparkapply *args`` armed with ``failpoint``, and check that it died by
    SIGKILL there."""
    proc = cli(*args, env={"SPARKAPPLY_TEST_FAILPOINT": failpoint})
    assert proc.returncode == -signal.SIGKILL, (
        f"failpoint {failpoint} was not hit (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    )


def prepare_transaction(dsn: str, gid: str, *statements: str) -> None:
    """Run ``statements`` in one transaction and PREPARE it as ``gid`` (left prepared)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        for s in statements:
            conn.execute(s)
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class Running:
    """A subscriber running in a thread until stopped."""

    def __init__(self, sub: Subscriber) -> None:
        self.sub = sub
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="test-run", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.sub.run()
        except BaseException as exc:
            self.errors.append(exc)

    def wait_flushed(self, target: Lsn) -> None:
        wait_until(
            lambda: self.sub.summary.flushed >= target or bool(self.errors),
            f"the subscriber to acknowledge {target}",
        )
        assert not self.errors, self.errors

    def stop(self) -> None:
        self.sub.stop()
        self.thread.join(120)
        assert not self.thread.is_alive()
        assert not self.errors, self.errors


def reader_rows(arrow: pa.Table) -> Counter[tuple[Any, ...]]:
    """The rows of a read, normalised (:func:`normalize`), as a multiset."""
    return Counter(_row(tuple(r.values())) for r in arrow.to_pylist())


def _same_in_arrow(a: pa.Table, b: pa.Table) -> bool:
    """A quick proof that two reads of one schema hold the same rows: equal as Arrow
    once both are sorted by every column Arrow can sort. Exact Arrow equality implies
    equality of the normalised rows, so True settles it; False proves nothing (rows
    that tie on the sort columns may come in another order, NaN is not equal to NaN
    in Arrow), and the normalised rows decide. Normalising is Python work per value,
    seconds for a table of a million rows; this is a fraction of a second."""
    if a.num_rows != b.num_rows:
        return False
    keys = [
        f.name
        for f in a.schema
        if not pa.types.is_nested(f.type) and not isinstance(f.type, pa.BaseExtensionType)
    ]
    if keys:
        order = [(k, "ascending") for k in keys]
        a = a.take(pc.sort_indices(a.select(keys), sort_keys=order))
        b = b.take(pc.sort_indices(b.select(keys), sort_keys=order))
    return bool(a.equals(b))


def assert_readers_agree(
    name: str,
    table: Table,
    pyiceberg: pa.Table,
    readers: Readers,
    snapshot_id: int | None = None,
) -> None:
    """DuckDB, iceberg-rust and Java Iceberg read ``table`` (``name`` in messages) as
    pyiceberg read it (``pyiceberg``): every column, every row, duplicates included. At
    ``snapshot_id`` (a cut's), the readers that read one (:data:`AT_SNAPSHOT`)."""
    for reader in READERS if snapshot_id is None else AT_SNAPSHOT:
        if can_read(reader, table):
            got = readers.read_like(reader, table, pyiceberg.schema, name, snapshot_id)
            at = "" if snapshot_id is None else f" at snapshot {snapshot_id}"
            assert_same_rows(f"{name}{at}", reader, got, pyiceberg)


def assert_cut_read_alike(
    mirror: Mirror,
    cut_tables: Mapping[str, int],
    reads: Mapping[str, pa.Table],
    readers: Readers,
    jdbc: JdbcCatalog | None = None,
) -> None:
    """Each table of a cut (``cut_tables``: its snapshot ids), as pyiceberg read it at
    the cut (``reads``), reads the same in the readers that read a snapshot; and, given
    ``jdbc``, in Spark SQL through Java's JdbcCatalog (``VERSION AS OF``), as users
    read a cut."""
    for name, snapshot_id in cut_tables.items():
        table = mirror.iceberg_table(name)
        assert_readers_agree(name, table, reads[name], readers, snapshot_id)
        if jdbc is not None and can_read("java", table):
            got = shared_java_reader().read_catalog(jdbc, name, snapshot_id)
            got = conform(got, reads[name].schema, "java (JdbcCatalog)", name)
            assert_same_rows(
                f"{name} at snapshot {snapshot_id}", "java (JdbcCatalog)", got, reads[name]
            )


def assert_same_rows(name: str, reader: str, got: pa.Table, pyiceberg: pa.Table) -> None:
    """``reader``'s read of ``name`` (``got``, conformed to pyiceberg's types) holds the
    rows pyiceberg's read holds, in the columns the reader read."""
    cols = got.column_names  # all but the columns the reader cannot read
    mine = pyiceberg.select(cols)
    if _same_in_arrow(got, mine):
        return
    expected = reader_rows(mine)
    actual = reader_rows(got)
    if actual == expected:
        return
    lines = [
        f"{name}: {reader} reads {got.num_rows} rows, pyiceberg {pyiceberg.num_rows}, "
        f"and they differ (columns {cols})"
    ]
    for who, rows in ((reader, actual - expected), ("pyiceberg", expected - actual)):
        for row in sorted(rows, key=repr)[:3]:
            lines.append(f"  only in {who}: {dict(zip(cols, row, strict=True))}")
    raise AssertionError("\n".join(lines))


def _toml_string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value, ensure_ascii=False)


def _row(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(normalize(v) for v in values)


_EXACT = decimal.Context(prec=2000)


def _dec(d: decimal.Decimal) -> Any:
    return "NaN" if d.is_nan() else ("dec", _EXACT.normalize(d) if d.is_finite() else d)


def normalize(v: Any) -> Any:
    """One comparable form for a value read from either side.

    Numbers compare exactly (no 28-digit default context); values that the documented
    mapping stores as text (domains, unconstrained numeric, json) compare by meaning.
    """
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return ("dec", _EXACT.normalize(decimal.Decimal(v)))
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return v
    if isinstance(v, decimal.Decimal):
        return _dec(v)
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        b = bytes(v)
        if len(b) == 16:
            try:
                return str(uuid.UUID(bytes=b))
            except ValueError:
                pass
        return b
    if isinstance(v, list):
        return tuple(normalize(x) for x in v)
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC)
    if isinstance(v, str):
        s = v.strip()
        try:
            d = decimal.Decimal(s)
        except decimal.InvalidOperation:
            return v
        if s.replace(".", "").replace("-", "").isdigit() or s in ("NaN",):
            return _dec(d)
        return v
    return v
