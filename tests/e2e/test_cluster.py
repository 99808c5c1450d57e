"""A real Spark cluster: a standalone master and one worker on loopback.

Both are started from the pyspark installation (``spark-class``) and stopped at the
end, also when the test fails. The subscriber runs as ``sparkapply run
--until-caught-up`` in a child process (this process already holds a local
SparkContext, and a process may have only one), with ``master = spark://…``: the
initial copy's tasks and the apply's tasks run in the worker's executor, which reads
the spool and writes the warehouse on the storage they share here (one machine).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from sparkapply.sink.catalog import open_catalog
from tests.mirror import Mirror

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class Cluster:
    url: str
    work_dir: Path  # the worker's: one directory per application
    master_log: Path


def _wait_for(
    what: str,
    check: object,
    procs: list[subprocess.Popen[bytes]],
    logs: list[Path],
    timeout: float = 120,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        for proc in procs:
            if proc.poll() is not None:
                break
        else:
            time.sleep(0.5)
            continue
        break
    tails = "\n".join(
        f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists()
    )
    raise AssertionError(f"the Spark cluster did not come up: {what}\n{tails}")


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    spark_class = str(_spark_home() / "bin" / "spark-class")
    port, master_ui, worker_ui = _free_port(), _free_port(), _free_port()
    url = f"spark://{LOOPBACK}:{port}"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": LOOPBACK,  # master, worker and executors bind loopback only
        "SPARK_HOME": str(_spark_home()),
        "PYSPARK_PYTHON": sys.executable,
    }
    logs = tmp_path / "cluster-logs"
    logs.mkdir()
    work_dir = tmp_path / "worker"
    procs: list[subprocess.Popen[bytes]] = []
    master_log, worker_log = logs / "master.log", logs / "worker.log"

    def start(log: Path, *args: str) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [spark_class, *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped as a whole
            )
        procs.append(proc)
        return proc

    try:
        start(
            master_log,
            "org.apache.spark.deploy.master.Master",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--webui-port",
            str(master_ui),
        )
        _wait_for(
            "the master listens",
            lambda: (
                "Starting Spark master" in master_log.read_text(errors="replace")
                and _listening(port)
            ),
            procs,
            [master_log],
        )
        start(
            worker_log,
            "org.apache.spark.deploy.worker.Worker",
            url,
            "--host",
            LOOPBACK,
            "--cores",
            "2",
            "--memory",
            "1g",
            "--webui-port",
            str(worker_ui),
            "--work-dir",
            str(work_dir),
        )
        _wait_for(
            "the worker registers",
            lambda: "Successfully registered with master" in worker_log.read_text(errors="replace"),
            procs,
            [master_log, worker_log],
        )
        yield Cluster(url, work_dir, master_log)
    finally:
        _stop(procs)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop each process group, the last started first: SIGTERM, then SIGKILL for one
    that has not ended 30 s later."""
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in reversed(procs):
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex((LOOPBACK, port)) == 0


def _write_config(path: Path, mirror: Mirror, master: str) -> Path:
    c = mirror.config
    props = c.sink.catalog
    path.write_text(
        f'work_dir = "{c.work_dir}"\n'
        f'[source]\ndsn = "{c.source.dsn}"\npublication = "pub"\nslot = "{mirror.slot}"\n'
        f'[sink.catalog]\ntype = "sql"\nuri = "{props["uri"]}"\n'
        f'warehouse = "{props["warehouse"]}"\n'
        f'[spark]\nmaster = "{master}"\napp_name = "sparkapply-cluster-test"\n'
        "[spark.conf]\n"
        '"spark.driver.host" = "127.0.0.1"\n'
        '"spark.driver.bindAddress" = "127.0.0.1"\n'
        '"spark.driver.memory" = "1g"\n'
        '"spark.executor.memory" = "512m"\n'
        '"spark.executor.cores" = "2"\n'
        '"spark.cores.max" = "2"\n'
        # The executors run this tree's sparkapply, as the driver does (on a real
        # cluster: the same version installed on every worker).
        f'"spark.executorEnv.PYTHONPATH" = "{REPO}"\n'
        # Every batch a Spark job, small ones too: the apply runs in the executor.
        "[apply]\nbatch_linger = 0.1\ndriver_fold_bytes = 0\n"
    )
    return path


def _run(config: Path, *, submit_to: str | None = None) -> None:
    """``sparkapply run --until-caught-up``; with ``submit_to``, through the README's
    ``examples/spark-submit.sh`` (spark-submit from the pyspark installation)."""
    env = {**os.environ, "SPARK_LOCAL_IP": LOOPBACK}
    command = [sys.executable, "-m", "sparkapply", "run", "--config", str(config)]
    if submit_to is not None:
        env["SPARK_MASTER"] = submit_to
        env["SPARK_HOME"] = str(_spark_home())
        env["PYSPARK_PYTHON"] = sys.executable
        env["PATH"] = os.pathsep.join(
            [str(Path(sys.executable).parent), str(_spark_home() / "bin"), env["PATH"]]
        )
        command = ["bash", str(REPO / "examples" / "spark-submit.sh"), str(config)]
    proc = subprocess.run(
        [*command, "--until-caught-up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (
        f"sparkapply run failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    )


def test_mirror_on_a_standalone_cluster(cluster: Cluster, pg_dsn: str, tmp_path: Path) -> None:
    mirror = Mirror(pg_dsn, tmp_path / "work", None)
    mirror.sql(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer int, amount numeric(12,2), "
        "status text, at timestamptz, doc jsonb)",
        "CREATE TABLE events (kind text, detail text)",
        "ALTER TABLE events REPLICA IDENTITY FULL",
        "INSERT INTO orders SELECT g, g % 100, g / 10.0, 'new', "
        "timestamptz '2026-01-01' + g * interval '1 minute', jsonb_build_object('g', g) "
        "FROM generate_series(1, 20000) g",
        "INSERT INTO events SELECT 'seed', 'event ' || g FROM generate_series(1, 100) g",
        "CREATE PUBLICATION pub FOR TABLE orders, events",
    )
    config = _write_config(tmp_path / "cluster.toml", mirror, cluster.url)
    _run(config)  # the initial copy, in the cluster's executor

    mirror.sql(
        "UPDATE orders SET status = 'paid' WHERE id % 3 = 0",
        "UPDATE orders SET id = id + 100000 WHERE id <= 10",
        "DELETE FROM orders WHERE id % 7 = 0",
        "DELETE FROM events WHERE detail LIKE 'event 1%'",
    )
    with psycopg.connect(pg_dsn) as conn:  # streamed, with a rolled-back savepoint
        conn.execute(
            "INSERT INTO orders SELECT g, 1, 1.5, 'bulk', now(), NULL "
            "FROM generate_series(200001, 230000) g"
        )
        conn.execute("SAVEPOINT s")
        conn.execute("DELETE FROM orders")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.execute("INSERT INTO events VALUES ('bulk', 'loaded')")
        conn.commit()
    _run(config, submit_to=cluster.url)  # streaming apply, started with spark-submit

    mirror.catalog = open_catalog(
        mirror.config.sink.catalog_name, mirror.config.catalog_properties()
    )
    mirror.assert_mirrored("public.orders", "public.events")
    # The work really ran on the cluster: the master registered both runs, and the
    # worker started executors for them.
    master_log = cluster.master_log.read_text(errors="replace")
    assert master_log.count("Registered app sparkapply-cluster-test") == 2, master_log[-3000:]
    executor_logs = list(cluster.work_dir.glob("app-*/*/stderr"))
    assert len(executor_logs) >= 2, executor_logs
    assert any("Running task" in p.read_text(errors="replace") for p in executor_logs)
