"""Read a mirrored table with Spark.

    python examples/read_spark.py --config examples/quickstart.toml shop.orders

Portable route, used here: pyiceberg plans the scan (data files minus position
deletes) and hands Arrow to Spark, so it needs nothing but pyspark and pyiceberg.

Native route, on a cluster that has Iceberg's Spark runtime jar
(``org.apache.iceberg:iceberg-spark-runtime-4.0_2.13``, from Maven): point a Spark
catalog at the same catalog sparkapply writes to and query it with SQL, e.g. for the
REST catalog of ``examples/rest-s3.toml``::

    spark.sql.extensions = org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions
    spark.sql.catalog.lake = org.apache.iceberg.spark.SparkCatalog
    spark.sql.catalog.lake.type = rest
    spark.sql.catalog.lake.uri = https://catalog.example.com/api/catalog
    spark.sql.catalog.lake.warehouse = analytics
    spark.sql.catalog.lake.io-impl = org.apache.iceberg.aws.s3.S3FileIO

    spark.table("lake.shop.orders")
"""

from __future__ import annotations

import argparse

from _catalog import open_catalog, table_name
from pyspark.sql import SparkSession


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the sparkapply config file")
    p.add_argument("table", help="schema.table")
    p.add_argument("--limit", type=int, default=10, help="rows to print")
    args = p.parse_args()

    arrow = (
        open_catalog(args.config).load_table(table_name(args.table, args.config)).scan().to_arrow()
    )
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("read-mirror")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = spark.createDataFrame(arrow)
        df.createOrReplaceTempView("mirror")
        print(f"rows: {spark.sql('SELECT count(*) FROM mirror').first()[0]}")
        first = df.columns[0]
        print("\t".join(df.columns))
        for row in df.orderBy(first).limit(args.limit).collect():
            print("\t".join("NULL" if v is None else str(v) for v in row))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
