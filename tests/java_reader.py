"""Iceberg's Java runtime as a reader, in a process of its own: the reference
implementation of the format, in the engine most users query the mirror with (Spark).

The runtime is Apache's ``iceberg-spark-runtime-3.5_2.12`` jar, as PyPI's
``snowpark-connect-deps-iceberg==1.0.2`` ships it (1.0.3 strips its bundled Jackson);
it needs Spark 3.5, and the tests' own environment runs pyspark 4 (no Iceberg runtime
exists for it yet). So the reader runs in a child process with a Python environment of
its own, ``.venv-java`` (pyspark 3.5, that wheel, pyarrow: ``scripts/bootstrap.sh``
makes it), and one JVM started once per test run. Iceberg's ``JdbcCatalog`` reads
pyiceberg's SQL catalog through Debian's JDBC drivers (``libxerial-sqlite-jdbc-java``,
``libpostgresql-jdbc-java``).

Two ways to read, as users do:

- by metadata file (:meth:`JavaReader.read`): the Spark source loads a table from its
  ``.metadata.json`` location, the same file pyiceberg read, at its current snapshot or
  at a snapshot id (a cut's);
- through ``JdbcCatalog`` (:meth:`JavaReader.read_catalog`) on pyiceberg's SQL catalog
  (a copy of the SQLite file, :func:`sqlite_catalog_copy`, or the PostgreSQL database),
  with ``SELECT … VERSION AS OF``.

Run as ``.venv-java/bin/python -m tests.java_reader`` (by :class:`JavaReader`, never by
hand); :mod:`tests.reader_process` runs the child and restarts it on a hang.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sqlite3
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa

from tests.reader_process import ROOT, ReaderProcess, serve

if TYPE_CHECKING:
    from pyiceberg.table import Table

JAVA_READ_SECONDS = 120.0
"""How long one read may take: a few tenths of a second once the JVM is warm, a few
seconds for the first (classes load); more is a hang."""

START_SECONDS = 180.0
"""How long the child may take to start its JVM and Spark on a loaded machine."""

JDBC_DRIVERS = ("/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/postgresql.jar")
"""Debian's JDBC drivers for JdbcCatalog (``libxerial-sqlite-jdbc-java``,
``libpostgresql-jdbc-java``)."""

_VECTORIZATION = "spark.sql.iceberg.vectorization.enabled"

PARSED = pa.schema(
    [
        ("location", pa.string()),
        ("error", pa.string()),
        ("format_version", pa.int32()),
        ("table_uuid", pa.string()),
        ("last_sequence_number", pa.int64()),
        ("current_schema_id", pa.int32()),
        ("current_snapshot_id", pa.int64()),
        ("snapshot_ids", pa.list_(pa.int64())),
    ]
)
"""What :meth:`JavaReader.parse_metadata` tells of each metadata file."""


def java_python() -> Path:
    """The Python of the Java reader's environment: ``$SPARKAPPLY_TEST_JAVA_PYTHON``, else
    ``.venv-java`` in this tree, else beside the tests' own virtualenv (a git worktree
    running the main tree's ``.venv``)."""
    named = os.environ.get("SPARKAPPLY_TEST_JAVA_PYTHON")
    candidates = [Path(named)] if named else []
    candidates += [
        ROOT / ".venv-java" / "bin" / "python",
        Path(sys.prefix).parent / ".venv-java" / "bin" / "python",
    ]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise AssertionError(
        "Java Iceberg's reader needs its environment .venv-java (pyspark 3.5 and "
        "Iceberg's Spark runtime), not found at "
        f"{', '.join(map(str, candidates))}: run scripts/bootstrap.sh"
    )


@dataclass(frozen=True)
class JdbcCatalog:
    """Iceberg's JdbcCatalog on a pyiceberg SQL catalog: ``name`` must be the catalog
    name pyiceberg wrote (``[sink] catalog_name``), the rows' ``catalog_name``."""

    name: str
    uri: str
    warehouse: str
    properties: dict[str, str] = field(default_factory=dict)


def jdbc_catalog(name: str, properties: Mapping[str, str]) -> JdbcCatalog:
    """The JdbcCatalog on the pyiceberg SQL catalog ``name`` of ``properties`` (its
    ``uri``, SQLAlchemy's URL of a SQLite file or a PostgreSQL database, and its
    ``warehouse``)."""
    url = urlsplit(properties["uri"])
    warehouse = properties["warehouse"]
    if url.scheme == "sqlite":  # sqlite:///relative or sqlite:////absolute
        return JdbcCatalog(name, f"jdbc:sqlite:{unquote(url.path[1:])}", warehouse)
    if url.scheme.startswith("postgresql"):
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        host = query.get("host") or url.hostname or "localhost"
        port = query.get("port") or url.port or 5432
        props = {"jdbc.user": unquote(url.username or "")}
        if url.password:
            props["jdbc.password"] = unquote(url.password)
        return JdbcCatalog(name, f"jdbc:postgresql://{host}:{port}{url.path}", warehouse, props)
    raise ValueError(f"no JDBC driver for a catalog at {url.scheme}:…")


def sqlite_catalog_copy(catalog: JdbcCatalog, copy: Path) -> JdbcCatalog:
    """``catalog`` (on a SQLite file) copied to ``copy`` by SQLite's backup, so that a
    commit under way is in the copy whole or not at all: Java reads the copy, and never
    holds a lock on the file the mirror commits to."""
    assert catalog.uri.startswith("jdbc:sqlite:"), catalog.uri
    source = catalog.uri.removeprefix("jdbc:sqlite:")
    with (
        contextlib.closing(sqlite3.connect(source)) as db,
        contextlib.closing(sqlite3.connect(copy)) as target,
    ):
        db.backup(target)
    return replace(catalog, uri=f"jdbc:sqlite:{copy}")


class JavaReader(ReaderProcess):
    """One child process reading tables with Iceberg's Java runtime in Spark 3.5."""

    def __init__(self, seconds: float = JAVA_READ_SECONDS) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"
        }
        env["PYTHONPATH"] = str(ROOT)  # tests.*, and nothing of the tests' own venv
        python = str(java_python())
        super().__init__(
            [python, "-m", "tests.java_reader"], "Java Iceberg", seconds, START_SECONDS, env
        )

    def read(
        self,
        table: Table,
        columns: list[str] | None = None,
        snapshot_id: int | None = None,
        vectorized: bool = True,
    ) -> pa.Table:
        """``table`` (``columns`` of it, or all) as Iceberg's Spark source reads the same
        metadata file pyiceberg read, at its current snapshot or at ``snapshot_id``;
        ``vectorized``: with Iceberg's vectorized Parquet reader (Spark's default) or
        its row reader."""
        return self.ask(
            {
                "metadata_location": table.metadata_location,
                "columns": columns,
                "snapshot_id": snapshot_id,
                "vectorized": vectorized,
            }
        )

    def read_catalog(
        self,
        catalog: JdbcCatalog,
        identifier: str,
        snapshot_id: int | None = None,
        vectorized: bool = True,
    ) -> pa.Table:
        """The table ``identifier`` (``namespace.name``) as Spark SQL reads it through
        JdbcCatalog: ``SELECT * FROM catalog.namespace.name [VERSION AS OF id]``."""
        return self.ask(
            {
                "catalog": {
                    "name": catalog.name,
                    "uri": catalog.uri,
                    "warehouse": catalog.warehouse,
                    "properties": catalog.properties,
                },
                "identifier": identifier.split("."),
                "columns": None,
                "snapshot_id": snapshot_id,
                "vectorized": vectorized,
            }
        )

    def parse_metadata(self, locations: list[str]) -> pa.Table:
        """Each metadata file of ``locations`` as Java's ``TableMetadataParser`` parses
        it, a row each (:data:`PARSED`): ``error`` says why Java refused one."""
        return self.ask({"parse": locations})

    def plan(self, table: Table, vectorized: bool = True) -> str:
        """Spark's physical plan for reading ``table``, to see which Iceberg reader a
        read uses (a vectorized scan is columnar: ``ColumnarToRow`` above the scan)."""
        request = {"metadata_location": table.metadata_location, "vectorized": vectorized}
        answer = self.ask({**request, "columns": None, "snapshot_id": None, "plan": True})
        return str(answer.column("plan")[0].as_py())


_shared: JavaReader | None = None


def shared_java_reader() -> JavaReader:
    """The test run's one Java reader process, stopped when the run ends."""
    global _shared
    if _shared is None:
        _shared = JavaReader()
        atexit.register(_shared.close)
    return _shared


def spark_unreadable(table: Table) -> list[str]:
    """The columns Spark cannot read: every column of a table with an Iceberg ``time``
    field anywhere. Spark has no time type, and Iceberg's Spark source fails converting
    such a table's schema ("Spark does not support time fields") before any column is
    chosen, so nothing of the table is read, not even the other columns."""
    from pyiceberg.schema import index_by_id
    from pyiceberg.types import TimeType

    schema = table.schema()
    if any(isinstance(f.field_type, TimeType) for f in index_by_id(schema).values()):
        return [f.name for f in schema.fields]
    return []


# THE CHILD (in .venv-java: the standard library, pyspark 3.5, pyarrow)


def _runtime_jar() -> str:
    import snowpark_connect_deps_iceberg

    jars = Path(snowpark_connect_deps_iceberg.__file__).parent / "jars"
    found = sorted(jars.glob("iceberg-spark-runtime-3.5_2.12-*.jar"))
    assert found, f"no Iceberg runtime for Spark 3.5 (Scala 2.12) in {jars}"
    return str(found[-1])


def _session() -> Any:
    from pyspark.sql import SparkSession

    missing = [j for j in JDBC_DRIVERS if not Path(j).exists()]
    assert not missing, f"JDBC drivers {missing} missing: run scripts/bootstrap.sh"
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("sparkapply-java-reader")
        .config("spark.jars", ",".join([_runtime_jar(), *JDBC_DRIVERS]))
        .config("spark.driver.memory", "1g")
        # Reads are small and many: the quick JIT alone, and the serial collector, halve
        # a read's time on a loaded 2-core machine (C2's compiler threads and G1's
        # workers compete with the tests for the cores).
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class _Child:
    def __init__(self) -> None:
        self.spark = _session()
        self.catalogs: dict[str, Any] = {}  # a session per JdbcCatalog, by its JSON

    def read(self, request: dict[str, Any]) -> pa.Table:
        if "parse" in request:
            return self._parse(request["parse"])
        catalog = request.get("catalog")
        session = self.spark if catalog is None else self._catalog_session(catalog)
        session.conf.set(_VECTORIZATION, str(request["vectorized"]).lower())
        if catalog is None:
            reader = session.read.format("iceberg")
            if request["snapshot_id"] is not None:
                reader = reader.option("snapshot-id", str(request["snapshot_id"]))
            frame = reader.load(request["metadata_location"])
        else:
            name = ".".join(_quoted(p) for p in [catalog["name"], *request["identifier"]])
            at = request["snapshot_id"]
            frame = session.sql(
                f"SELECT * FROM {name}" + ("" if at is None else f" VERSION AS OF {int(at)}")
            )
        if request["columns"] is not None:
            frame = frame.select(*[_quoted(c) for c in request["columns"]])
        if request.get("plan"):
            plan = frame._jdf.queryExecution().executedPlan().toString()
            return pa.table({"plan": [plan]})
        return _arrow(frame)

    def _parse(self, locations: list[str]) -> pa.Table:
        """Each metadata file as Java's ``TableMetadataParser`` reads it (which checks
        what the spec requires of one): what it found, or why it refused the file."""
        jvm = self.spark._jvm
        io = jvm.org.apache.iceberg.hadoop.HadoopFileIO(self.spark._jsc.hadoopConfiguration())
        rows: list[dict[str, Any]] = []
        for location in locations:
            try:
                meta = jvm.org.apache.iceberg.TableMetadataParser.read(io, location)
            except Exception as exc:  # the parser's message, for the test to show
                rows.append({"location": location, "error": str(exc).splitlines()[0]})
                continue
            current = meta.currentSnapshot()
            rows.append(
                {
                    "location": location,
                    "error": None,
                    "format_version": meta.formatVersion(),
                    "table_uuid": meta.uuid(),
                    "last_sequence_number": meta.lastSequenceNumber(),
                    "current_schema_id": meta.currentSchemaId(),
                    "current_snapshot_id": None if current is None else current.snapshotId(),
                    "snapshot_ids": [s.snapshotId() for s in meta.snapshots()],
                }
            )
        return pa.Table.from_pylist(rows, schema=PARSED)

    def _catalog_session(self, catalog: dict[str, Any]) -> Any:
        """A Spark session whose catalog ``name`` is that JdbcCatalog (Spark names a
        catalog once per session; JdbcCatalog's name is the catalog's rows' name)."""
        import json

        key = json.dumps(catalog, sort_keys=True)
        if key not in self.catalogs:
            session = self.spark.newSession()
            prefix = f"spark.sql.catalog.{catalog['name']}"
            settings = {
                "": "org.apache.iceberg.spark.SparkCatalog",
                ".catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
                ".uri": catalog["uri"],
                ".warehouse": catalog["warehouse"],
                # pyiceberg made the tables; a reader creates none.
                ".jdbc.init-catalog-tables": "false",
                # Every read asks the catalog for the table's current metadata.
                ".cache-enabled": "false",
                **{f".{k}": v for k, v in catalog["properties"].items()},
            }
            for suffix, value in settings.items():
                session.conf.set(prefix + suffix, value)
            self.catalogs[key] = session
        return self.catalogs[key]


def _arrow(frame: Any) -> pa.Table:
    """The frame's rows as Arrow, as Spark serialises them (its own Arrow writer)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    batches = frame._collect_as_arrow()
    if batches:
        return pa.Table.from_batches(batches)
    return to_arrow_schema(frame.schema).empty_table()


def main() -> None:
    child = _Child()
    serve(child.read)


if __name__ == "__main__":
    main()
