"""The Spark session: one per process, configured from ``[spark]``, and where Spark's
own output goes.

Spark's JVM talks a lot on a terminal: the log4j banner, Hadoop's ``NativeCodeLoader``
warning, the JDK's "Using incubator modules" line and every WARN of every library. A
tool's user wants sparkapply's own log there, not that. So, unless the command line
asked for ``--verbose`` (see :func:`configure_spark_logging`), the driver JVM gets a
log4j2 configuration that writes to ``<work_dir>/logs/spark.log``, and the JVM
launcher's stdout and stderr (which the JDK's own warnings bypass log4j to reach) go
to the same file. Python's own stderr (sparkapply's log, the copy's progress bars) is
untouched. Executors on a cluster log where their worker puts logs, as usual.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkapply.state import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    # Executors are Python-heavy; one task per core and reused workers.
    "spark.python.worker.reuse": "true",
    "spark.task.maxFailures": "1",
    # Workers forked from a daemon that has imported the apply (apply/daemon.py).
    "spark.python.daemon.module": "sparkapply.apply.daemon",
    # Maintenance runs its jobs beside the apply's, in a pool of its own: pools share
    # the cores fairly, so a compaction does not hold back a batch's tasks.
    "spark.scheduler.mode": "FAIR",
}

# A local session's JVM compiles with C1 only. C2 recompiles hot methods in bursts
# that come long after start, and on a small machine each burst takes a core from
# the walsender and the apply: in the race's pgbench drains, C2's compiler thread used
# 140 ms of CPU in a 0.61 s drain (0.46-0.52 s without it). The driver's JVM only
# schedules tasks and passes small results; the folds run in Python.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"

LOG4J2_TEMPLATE = """\
# Written by sparkapply (sparkapply/apply/session.py): Spark's driver logs to a file.
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yyyy-MM-dd HH:mm:ss.SSS}} %p %c{{1}}: %m%n%ex
# Known noise at WARN on every start.
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
"""


@dataclass(slots=True)
class SparkLogging:
    """Where the next session's JVM output goes: ``log_dir`` (a file there) or, when
    ``verbose`` or no directory is set, the console as Spark does by default."""

    log_dir: Path | None = None
    verbose: bool = False

    @property
    def to_file(self) -> bool:
        return self.log_dir is not None and not self.verbose


_LOGGING = SparkLogging()


def configure_spark_logging(work_dir: Path | None, *, verbose: bool = False) -> None:
    """Send the Spark output of sessions started from now on to ``<work_dir>/logs``
    (``verbose``: to the console). Called by the command line before a session starts."""
    _LOGGING.log_dir = None if work_dir is None else layout.logs_dir(Path(work_dir).absolute())
    _LOGGING.verbose = verbose


def spark_log_file() -> Path | None:
    """The file Spark's driver output goes to, or None when it goes to the console."""
    return _LOGGING.log_dir / "spark.log" if _LOGGING.to_file and _LOGGING.log_dir else None


def _java_options(*options: str | None) -> str:
    """JVM options one after another (a later value of a flag wins)."""
    return " ".join(o for o in options if o)


def get_session(
    master: str = "local[2]", app_name: str = "sparkapply", conf: Mapping[str, str] | None = None
) -> SparkSession:
    from pyspark.sql import SparkSession

    # Executors must run the interpreter that has sparkapply installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = master.startswith("local")
    if local:
        # A local session has no business on any interface but loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = spark_settings(master, conf)
    log_file = spark_log_file()
    if log_file is not None and _no_active_context():
        # The JVM takes a while to start: say so, and where its output goes.
        log.info("starting Spark (master %s); Spark's own log: %s", master, log_file)
        _start_context_logging_to(log_file, master, app_name, settings)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if log_file is None:
        # On the console: --verbose wants Spark's warnings; a library caller (tests,
        # benchmarks) only its errors.
        spark.sparkContext.setLogLevel("WARN" if _LOGGING.verbose else "ERROR")
    return spark


def spark_settings(master: str, conf: Mapping[str, str] | None) -> dict[str, str]:
    """The session's Spark settings: :data:`DEFAULT_CONF`, then ``conf`` (the user's
    ``[spark.conf]``); a local session also binds to loopback and runs its JVM with
    :data:`LOCAL_JAVA_OPTIONS` before the user's own options (a flag's last value
    wins, so the user's stand)."""
    local = master.startswith("local")
    settings = dict(DEFAULT_CONF)
    if local:
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    if local:
        settings["spark.driver.extraJavaOptions"] = _java_options(
            LOCAL_JAVA_OPTIONS, settings.get("spark.driver.extraJavaOptions")
        )
    return settings


def warm_workers(spark: SparkSession) -> None:
    """Start the worker daemon and a worker per core now (one task each), so that the
    first batch does not wait for them."""
    n = max(1, spark.sparkContext.defaultParallelism)
    spark.sparkContext.parallelize(range(n), n).foreach(_nothing)


def _nothing(_: object) -> None:
    return None


def _no_active_context() -> bool:
    from pyspark import SparkContext

    # Under spark-submit the driver JVM is already running (and logs as spark-submit
    # was told); only a JVM started here can be pointed at the file.
    launched_by_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    return SparkContext._active_spark_context is None and not launched_by_spark_submit


def _start_context_logging_to(
    log_file: Path, master: str, app_name: str, settings: dict[str, str]
) -> None:
    """Start the SparkContext (the driver JVM) with its output going to ``log_file``.

    ``SparkSession.builder`` cannot redirect the launcher's own streams, so the JVM
    is launched here with them pointed at the file; the builder then finds this
    context and uses it.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    log_file.parent.mkdir(parents=True, exist_ok=True)
    log4j_conf = log_file.parent / "log4j2.properties"
    log4j_conf.write_text(LOG4J2_TEMPLATE.format(log_file=log_file))
    settings["spark.driver.extraJavaOptions"] = _java_options(
        settings.get("spark.driver.extraJavaOptions"),
        f"-Dlog4j2.configurationFile={log4j_conf.as_uri()}",
    )
    conf = SparkConf(loadDefaults=False)
    conf.setMaster(master).setAppName(app_name)
    for key, value in settings.items():
        conf.set(key, value)
    with open(log_file, "ab") as sink:
        # The child keeps its own copies of the descriptors; ours can close.
        popen: dict[str, Any] = {"stdout": sink, "stderr": sink}
        gateway = launch_gateway(conf, popen_kwargs=popen)  # type: ignore[no-untyped-call]
    SparkContext(conf=conf, gateway=gateway)
