"""Consumers that live beside the load, as users run them, and the publisher's view of
them.

- :class:`SparkapplyProcess`: ``sparkapply run --config F``, the real command line in
  a child process of its own (session and process group), with the default config:
  only ``[spark] master``, the work dir, the slot and the SQL catalog are set. Its
  log (stderr) goes to a file beside its config. It is *paused* by SIGSTOP of its
  whole process tree (driver, JVM, Python workers: found by parent links, since
  Spark's worker daemon makes a process group of its own) and, by default, of its
  walsender on the publisher, so that nothing of a load is decoded before it is
  released; *resumed* by SIGCONT.
- :class:`NativeSubscription`: PostgreSQL's own subscriber (``streaming = parallel``,
  ``copy_data = true``), *paused* by ``ALTER SUBSCRIPTION ... DISABLE`` (its apply
  worker and walsender exit), *resumed* by ``ENABLE``.
- :class:`SlotWatch`: one connection to the publisher that polls slots'
  ``confirmed_flush_lsn``: when a consumer has everything up to a position.

Every process started here is ended by :meth:`SparkapplyProcess.stop` (SIGTERM to the
driver, then SIGKILL of whatever is left of the tree it had), which the benchmarks
call in ``finally`` blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import psycopg

from benchlib.metering import process_tree, signal_alive, start_time, stop_tree
from benchlib.report import log
from benchlib.servers import LIVE_PUBLISHER, LIVE_SUBSCRIBER, PUBLICATION
from sparkapply.embedded import EmbeddedPostgres
from sparkapply.lsn import Lsn

SPARK_MASTER = "local[2]"
POLL = 0.01  # seconds between looks at a slot while a consumer is timed


class LiveConsumer(Protocol):
    name: str
    slot: str

    def pause(self) -> None:
        """Stop consuming (the slot keeps what arrives)."""

    def resume(self) -> None:
        """Consume again, at once."""

    def check(self) -> None:
        """Raise SystemExit if the consumer has failed."""


def sparkapply_config_text(
    work_dir: Path, dsn: str, slot: str, *, maintenance: bool = True, cuts: bool = True
) -> str:
    """The config a user writes for one machine: the source, the work dir, the SQL
    catalog beside it and ``local[2]``; everything else at its default (maintenance
    on, one catalog transaction per batch with its cut), unless ``maintenance`` or
    ``cuts`` is False (then tables commit one by one and no cut is recorded, as before
    cuts existed)."""

    def q(value: object) -> str:  # a TOML basic string (JSON's escapes are TOML's)
        return json.dumps(str(value))

    lines = [
        f"work_dir = {q(work_dir)}",
        "",
        "[source]",
        f"dsn = {q(dsn)}",
        f"publication = {q(PUBLICATION)}",
        f"slot = {q(slot)}",
        "",
        *([] if cuts else ["[sink]", "atomic_commit = false", 'cuts_table = ""', ""]),
        "[sink.catalog]",
        'type = "sql"',
        'uri = "sqlite:///{work_dir}/catalog.db"',
        'warehouse = "file://{work_dir}/warehouse"',
        "",
        "[spark]",
        f"master = {q(SPARK_MASTER)}",
    ]
    if not maintenance:
        lines += ["", "[maintenance]", "enabled = false"]
    return "\n".join(lines) + "\n"


def live_settings(
    synchronous_commit: str, native: dict[str, Any] | None = None, **config: bool
) -> dict[str, Any]:
    """What a live benchmark's result records of its setup: both servers' settings, the
    native subscription's options (``native`` adds to them) and sparkapply's config
    (``config``: :func:`sparkapply_config_text`'s options)."""
    return {
        "publisher": LIVE_PUBLISHER,
        "subscriber": LIVE_SUBSCRIBER,
        "native_subscription": {
            "streaming": "parallel",
            "synchronous_commit": synchronous_commit,
            **(native or {}),
        },
        "sparkapply_config": sparkapply_config_text(
            Path("<work_dir>"), "<dsn>", "<slot>", **config
        ),
    }


def cleanup(*steps: Callable[[], None]) -> None:
    """Run every step, even when one fails: a failure is logged, not raised, so that
    it neither stops the next step nor hides the error that led here."""
    for step in steps:
        try:
            step()
        except (Exception, SystemExit) as exc:
            log(f"cleanup: {getattr(step, '__qualname__', step)} failed: {exc}")


class SlotWatch:
    """The publisher's view of the consumers: one connection, polled."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> SlotWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def insert_lsn(self) -> Lsn:
        row = self.conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(str(row[0]))

    def written_lsn(self) -> Lsn:
        """``pg_current_wal_lsn()``: the WAL written (what the freshness samples read)."""
        row = self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return Lsn.parse(str(row[0]))

    def slot(self, slot: str) -> tuple[Lsn | None, int | None] | None:
        """(confirmed_flush_lsn, active_pid) of ``slot``, or None if there is none."""
        row = self.conn.execute(
            "SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        if row is None:
            return None
        return (None if row[0] is None else Lsn.parse(str(row[0]))), row[1]

    def sent(self, pid: int) -> Lsn | None:
        """What the walsender ``pid`` has sent (pg_stat_replication.sent_lsn)."""
        row = self.conn.execute(
            "SELECT sent_lsn::text FROM pg_stat_replication WHERE pid = %s", (pid,)
        ).fetchone()
        return None if row is None or row[0] is None else Lsn.parse(str(row[0]))

    def wait(
        self,
        slot: str,
        target: Lsn,
        *,
        timeout: float,
        check: Callable[[], None] | None = None,
        interval: float = POLL,
        what: str = "",
    ) -> tuple[float, float | None]:
        """Poll ``slot`` every ``interval`` s until its confirmed_flush_lsn reaches
        ``target``; (the monotonic time it was seen there, the first time the slot was
        seen active, if it was). ``check`` runs every half second; SystemExit after
        ``timeout``."""
        started = last_check = time.monotonic()
        active_at: float | None = None
        while True:
            state = self.slot(slot)
            now = time.monotonic()
            if state is not None:
                confirmed, pid = state
                if pid is not None and active_at is None:
                    active_at = now
                if confirmed is not None and confirmed >= target:
                    return now, active_at
            if now - last_check > 0.5:
                last_check = now
                if check is not None:
                    check()
                if now - started > timeout:
                    got = "no slot" if state is None else str(state[0])
                    raise SystemExit(
                        f"{what or slot}: not at {target} after {timeout:.0f}s (at {got})"
                    )
            time.sleep(interval)

    def wait_slot(self, slot: str, *, timeout: float, check: Callable[[], None]) -> None:
        """Wait until ``slot`` exists."""
        started = time.monotonic()
        while self.slot(slot) is None:
            check()
            if time.monotonic() - started > timeout:
                raise SystemExit(f"slot {slot} not created after {timeout:.0f}s")
            time.sleep(0.2)

    def wait_inactive(self, slot: str, *, timeout: float = 60.0) -> None:
        started = time.monotonic()
        while True:
            state = self.slot(slot)
            if state is None or state[1] is None:
                return
            if time.monotonic() - started > timeout:
                raise SystemExit(f"slot {slot} still active after {timeout:.0f}s")
            time.sleep(0.05)

    def drop_slot(self, slot: str) -> None:
        if self.slot(slot) is not None:
            self.wait_inactive(slot)
            self.conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def sparkapply_command() -> list[str]:
    """The installed ``sparkapply`` script beside this interpreter, else ``-m``."""
    script = Path(sys.executable).parent / "sparkapply"
    return [str(script)] if script.exists() else [sys.executable, "-m", "sparkapply"]


class SparkapplyProcess:
    """``sparkapply run --config <dir>/sparkapply.toml``, its log in
    ``<dir>/sparkapply.log``, its work dir ``<dir>/work``."""

    def __init__(
        self,
        directory: Path,
        pub: EmbeddedPostgres,
        slot: str,
        *,
        maintenance: bool = True,
        freeze_walsender: bool = True,
        cuts: bool = True,
    ) -> None:
        self.name = "sparkapply"
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pub = pub
        self.slot = slot
        self.work_dir = self.dir / "work"
        self.config_path = self.dir / "sparkapply.toml"
        self.config_text = sparkapply_config_text(
            self.work_dir, pub.dsn(), slot, maintenance=maintenance, cuts=cuts
        )
        self.config_path.write_text(self.config_text)
        self.log_path = self.dir / "sparkapply.log"
        self.freeze_walsender = freeze_walsender
        self.proc: subprocess.Popen[bytes] | None = None
        self._frozen: list[tuple[int, int]] = []
        self._walsender: list[tuple[int, int]] = []
        self.walsender_pid: int | None = None  # of the last pause

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        # SPARKAPPLY_* variables override the config: the run must see its file alone.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKAPPLY_")}
        cmd = [*sparkapply_command(), "run", "--config", str(self.config_path)]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=env,
                start_new_session=True,
            )
        log(f"started {' '.join(cmd)} (pid {self.proc.pid}), log {self.log_path}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise SystemExit(
                f"sparkapply exited (code {code}); the end of its log:\n{self.log_tail()}"
            )

    @property
    def paused(self) -> bool:
        return bool(self._frozen)

    def pause(self) -> None:
        """SIGSTOP the whole process tree, then (by default) its walsender."""
        if self._frozen:
            return
        self.check()
        self._frozen = stop_tree(self.pid)
        self.walsender_pid = None
        if self.freeze_walsender:
            with psycopg.connect(self.pub.dsn(), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (self.slot,),
                ).fetchone()
            pid = None if row is None else row[0]
            started = None if pid is None else start_time(int(pid))
            if pid is not None and started is not None:
                os.kill(int(pid), signal.SIGSTOP)
                self._walsender = [(int(pid), started)]
                self.walsender_pid = int(pid)

    def resume(self) -> None:
        """SIGCONT the walsender, then the tree (children first)."""
        signal_alive(self._walsender, signal.SIGCONT)
        signal_alive(list(reversed(self._frozen)), signal.SIGCONT)
        self._walsender, self._frozen = [], []

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (the CLI finishes the batch and exits), then SIGKILL what is left
        of the tree. Safe to call twice, and when it never started."""
        if self.proc is None:
            return
        tree = [(pid, s) for pid in process_tree(self.pid) if (s := start_time(pid)) is not None]
        self.resume()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"sparkapply (pid {self.pid}) did not stop in {timeout:.0f}s: killing it")
        signal_alive(tree, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.proc = None


class NativeSubscription:
    """A native subscription ``name`` (its slot has the same name) on ``sub``, copying
    the publication's tables (``copy_data = true``) when created.

    ``synchronous_commit`` is the subscription's own setting for its apply workers
    (PostgreSQL's default for subscriptions is ``off``): with the server's ``fsync =
    off``, ``on`` writes each applied transaction's WAL to the OS at its commit, as
    sparkapply writes its files before it acknowledges, without an fsync.
    """

    def __init__(
        self,
        pub: EmbeddedPostgres,
        sub: EmbeddedPostgres,
        name: str,
        *,
        synchronous_commit: str = "on",
    ) -> None:
        self.pub, self.sub = pub, sub
        self.name = self.slot = name
        self.synchronous_commit = synchronous_commit
        self.conn = psycopg.connect(sub.dsn(), autocommit=True)
        self.created = False
        self.parallel_workers_seen = 0

    def create(self) -> None:
        self.conn.execute(
            f"CREATE SUBSCRIPTION {self.name} CONNECTION '{self.pub.dsn()}'"
            f" PUBLICATION {PUBLICATION} WITH (copy_data = true, streaming = parallel,"
            f" synchronous_commit = '{self.synchronous_commit}', create_slot = true)"
        )
        self.created = True

    def wait_ready(self, timeout: float = 1800.0) -> None:
        """Until every table of the subscription is synchronised (``r``)."""
        started = time.monotonic()
        while True:
            row = self.conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE r.srsubstate = 'r')"
                " FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid"
                " WHERE s.subname = %s",
                (self.name,),
            ).fetchone()
            if row is not None and row[0] > 0 and row[0] == row[1]:
                return
            self.check()
            if time.monotonic() - started > timeout:
                raise SystemExit(f"native subscription {self.name}: not synchronised")
            time.sleep(0.2)

    def check(self) -> None:
        row = self.conn.execute(
            "SELECT apply_error_count, sync_error_count FROM pg_stat_subscription_stats"
            " WHERE subname = %s",
            (self.name,),
        ).fetchone()
        if row is not None and (row[0] or row[1]):
            raise SystemExit(
                f"native subscription {self.name} failed (apply errors {row[0]}, sync"
                f" errors {row[1]}); see {self.sub.data_dir / 'server.log'}"
            )
        seen = self.conn.execute(
            "SELECT count(*) FROM pg_stat_subscription WHERE subname = %s"
            " AND leader_pid IS NOT NULL",
            (self.name,),
        ).fetchone()
        self.parallel_workers_seen = max(self.parallel_workers_seen, int(seen[0]) if seen else 0)

    def pause(self) -> None:
        """DISABLE, and wait until its walsender has let the slot go."""
        self.conn.execute(f"ALTER SUBSCRIPTION {self.name} DISABLE")
        with SlotWatch(self.pub.dsn()) as watch:
            watch.wait_inactive(self.slot)

    def resume(self) -> None:
        self.conn.execute(f"ALTER SUBSCRIPTION {self.name} ENABLE")

    def drop(self) -> None:
        if self.created:
            self.conn.execute(f"DROP SUBSCRIPTION {self.name}")  # and its slot
            self.created = False

    def close(self) -> None:
        try:
            self.drop()
        finally:
            self.conn.close()


def table_sums(conn: psycopg.Connection[Any], table: str, columns: tuple[str, ...]) -> list[str]:
    """count(*) and sum() of each column, as text: a table's checksum."""
    sums = ", ".join(f"coalesce(sum({c}), 0)::text" for c in columns)
    row = conn.execute(f"SELECT count(*)::text, {sums} FROM {table}").fetchone()
    assert row is not None
    return [str(v) for v in row]


def iceberg_sums(catalog: Any, table: str, columns: tuple[str, ...]) -> list[str]:
    """The same checksum over the Iceberg copy ``public.<table>``, as a reader sees it."""
    from decimal import Decimal

    import pyarrow.compute as pc

    arrow = catalog.load_table(("public", table)).scan(selected_fields=columns).to_arrow()
    out = [str(arrow.num_rows)]
    for c in columns:
        total = pc.sum(arrow.column(c)).as_py()
        out.append(str(Decimal(0) if total is None else total))
    return out
