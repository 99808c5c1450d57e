"""The Spark session: one per process, configured from ``[spark]``."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    # Executors are Python-heavy; one task per core and reused workers.
    "spark.python.worker.reuse": "true",
    "spark.task.maxFailures": "1",
}


def get_session(
    master: str = "local[2]", app_name: str = "sparkapply", conf: Mapping[str, str] | None = None
) -> SparkSession:
    # Executors must run the interpreter that has sparkapply installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = master.startswith("local")
    if local:
        # A local session has no business on any interface but loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    defaults = dict(DEFAULT_CONF)
    if local:
        defaults["spark.driver.host"] = "127.0.0.1"
        defaults["spark.driver.bindAddress"] = "127.0.0.1"
    for key, value in {**defaults, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
