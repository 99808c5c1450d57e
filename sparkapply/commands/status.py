"""``sparkapply status``: the slot, each table, pending prepared transactions, the spool.

Everything is read from where it is durable, never from a running process: the slot
from ``pg_replication_slots`` on the publisher, each table from its Iceberg snapshot
summary, prepared transactions and the spool from ``work_dir``. So it answers the same
whether ``run`` is running or not, and reads nothing that ``run`` locks. It starts no
Spark session.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from sparkapply.changes.cut_requests import CutRequests
from sparkapply.changes.prepared import pending_prepared
from sparkapply.changes.skip import SkipStore
from sparkapply.config import Config
from sparkapply.copy.snapshot import published_tables
from sparkapply.errors import CutError
from sparkapply.lsn import Lsn
from sparkapply.pgoutput.frames import PG_EPOCH_OFFSET_MICROS
from sparkapply.sink.atomic import commit_mode
from sparkapply.sink.read import latest_cut
from sparkapply.sink.stats import TableStats, table_stats
from sparkapply.source.connection import connect, describe_dsn
from sparkapply.state.layout import spool_bytes
from sparkapply.state.run_state import read_run_state


@dataclass(frozen=True, slots=True)
class SlotStatus:
    name: str
    exists: bool
    active: bool = False
    active_pid: int | None = None
    confirmed_lsn: str | None = None
    server_lsn: str | None = None  # pg_current_wal_lsn()
    lag_bytes: int | None = None  # server_lsn - confirmed_lsn
    retained_bytes: int | None = None  # server_lsn - restart_lsn: WAL the slot keeps
    wal_status: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedStatus:
    gid: str
    xid: int
    prepare_lsn: str
    since: dt.datetime  # the PREPARE's time on the publisher


@dataclass(frozen=True, slots=True)
class TableStatus:
    source: str  # "schema.table" on the publisher
    iceberg: str  # "namespace.table"
    exists: bool
    applied_lsn: str | None
    last_commit: dt.datetime | None
    rows: int | None
    data_files: int | None
    delete_files: int | None


@dataclass(frozen=True, slots=True)
class RunStatus:
    """The work_dir's ``run``, from its ``run.json`` (state/run_state.py)."""

    state: str  # starting, streaming, retrying, stopped, failed; "gone": died unannounced
    pid: int
    since: dt.datetime
    last_batch: dt.datetime | None
    error: str | None
    attempts: int


@dataclass(frozen=True, slots=True)
class Status:
    publisher: str  # host:port/db as user (never the password)
    slot: SlotStatus
    tables: list[TableStatus] = field(default_factory=list)
    prepared: list[PreparedStatus] = field(default_factory=list)
    spool_bytes: int = 0
    pending_skip: str | None = None  # the LSN `sparkapply skip` asked for, not yet done
    commits: str = ""  # how a batch commits: atomic (one catalog transaction) or not
    latest_cut: str | None = None  # LSN of the newest cut (sink/cuts.py)
    cut_requests: list[str] = field(default_factory=list)  # `cut --at-lsn` not yet made
    run: RunStatus | None = None  # None: no `run` has used this work_dir

    def health(self) -> str | None:
        """None when a run streams from the slot; otherwise why not, in a line."""
        run = self.run
        if run is None:
            return "no run has used this work_dir"
        if run.state == "retrying":
            return (
                f"the run has retried {run.attempts} time(s) since {_when(run.since)}: {run.error}"
            )
        if run.state != "streaming":
            return f"the run is {run.state}" + (f": {run.error}" if run.error else "")
        if not self.slot.exists:
            return f"slot {self.slot.name} does not exist"
        if not self.slot.active:
            return f"slot {self.slot.name} is not streaming to anyone"
        return None


def gather(config: Config, catalog: Any | None = None) -> Status:
    """Read the status; ``catalog`` defaults to the configured one."""
    src = config.source
    where = describe_dsn(src.dsn)
    with connect(
        src.dsn, application_name="sparkapply status", connect_timeout=src.connect_timeout
    ) as conn:
        slot = _slot(conn, src.slot)
        names = published_tables(conn, src.publication)
    if catalog is None:
        from sparkapply.sink.catalog import open_catalog

        catalog = open_catalog(config.sink.catalog_name, config.catalog_properties())
    tables = []
    for schema, name in names:
        ident = config.table_identifier(schema, name)
        tables.append(_table(f"{schema}.{name}", table_stats(catalog, ident)))
    prepared = [
        PreparedStatus(
            gid=e.gid,
            xid=e.xid,
            prepare_lsn=str(e.prepare_lsn),
            since=pg_timestamp(e.prepare_time),
        )
        for e in pending_prepared(config.work_dir)
    ]
    skip = SkipStore(config.work_dir).get()
    commits = commit_mode(catalog) if config.sink.atomic_commit else "table by table (configured)"
    return Status(
        publisher=where,
        slot=slot,
        tables=tables,
        prepared=prepared,
        spool_bytes=spool_bytes(config.work_dir),
        pending_skip=None if skip is None else str(skip.lsn),
        commits=commits,
        latest_cut=_latest_cut(config, catalog),
        cut_requests=[str(lsn) for lsn in CutRequests(config.work_dir).pending()],
        run=_run(config),
    )


def _run(config: Config) -> RunStatus | None:
    state = read_run_state(config.work_dir)
    if state is None:
        return None

    def stamp(t: float | None) -> dt.datetime | None:
        return None if t is None else dt.datetime.fromtimestamp(t, dt.UTC)

    since = stamp(state.since)
    assert since is not None
    return RunStatus(
        state=state.state if state.alive() or state.state in ("stopped", "failed") else "gone",
        pid=state.pid,
        since=since,
        last_batch=stamp(state.last_batch),
        error=state.error,
        attempts=state.attempts,
    )


def _when(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def _latest_cut(config: Config, catalog: Any) -> str | None:
    if not config.sink.cuts_table:
        return None
    try:
        return str(latest_cut(catalog, cuts_table=config.sink.cuts_table).lsn)
    except CutError:  # none yet
        return None


def pg_timestamp(micros: int) -> dt.datetime:
    """A pgoutput timestamp (microseconds since 2000-01-01 UTC) as a UTC datetime."""
    return dt.datetime.fromtimestamp((micros + PG_EPOCH_OFFSET_MICROS) / 1e6, dt.UTC)


def _slot(conn: psycopg.Connection[Any], name: str) -> SlotStatus:
    row = conn.execute(
        """
        SELECT active, active_pid, confirmed_flush_lsn::text, pg_current_wal_lsn()::text,
               pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
               pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, wal_status
        FROM pg_replication_slots WHERE slot_name = %s
        """,
        (name,),
    ).fetchone()
    if row is None:
        return SlotStatus(name, exists=False)
    active, pid, confirmed, current, lag, retained, wal_status = row
    return SlotStatus(
        name,
        exists=True,
        active=bool(active),
        active_pid=pid,
        confirmed_lsn=confirmed,
        server_lsn=current,
        lag_bytes=None if lag is None else int(lag),
        retained_bytes=None if retained is None else int(retained),
        wal_status=wal_status,
    )


def _table(source: str, stats: TableStats) -> TableStatus:
    return TableStatus(
        source=source,
        iceberg=stats.identifier,
        exists=stats.exists,
        applied_lsn=None if stats.applied_lsn is None else str(Lsn(stats.applied_lsn)),
        last_commit=stats.last_commit,
        rows=stats.rows,
        data_files=stats.data_files,
        delete_files=stats.delete_files,
    )


# -- rendering ----------------------------------------------------------------------------


def to_json(status: Status) -> str:
    def default(value: object) -> str:
        if isinstance(value, dt.datetime):
            return value.isoformat()
        raise TypeError(f"not JSON: {type(value).__name__}")

    return json.dumps(asdict(status), default=default, indent=2)


def render_text(status: Status) -> str:
    """The status as a terminal shows it: aligned columns, sizes in binary units."""
    s = status.slot
    lines = [f"publisher  {status.publisher}"]
    if not s.exists:
        lines.append(f"slot       {s.name}: does not exist (created by the first `run`)")
    else:
        state = f"active (pid {s.active_pid})" if s.active else "inactive"
        lines.append(
            f"slot       {s.name}: {state}, confirmed {s.confirmed_lsn}, server at "
            f"{s.server_lsn}, lag {_bytes(s.lag_bytes)}, WAL retained "
            f"{_bytes(s.retained_bytes)}" + (f" ({s.wal_status})" if s.wal_status else "")
        )
    lines.append(f"run        {_render_run(status.run)}")
    lines.append(f"spool      {_bytes(status.spool_bytes)}")
    lines.append(f"commits    {status.commits}")
    cut = status.latest_cut or "none yet"
    asked = f" (asked for: {', '.join(status.cut_requests)})" if status.cut_requests else ""
    lines.append(f"cuts       latest at {cut}{asked}")
    if status.pending_skip:
        lines.append(f"skip       transaction at {status.pending_skip} (pending)")
    lines.append("")
    header = (
        "table",
        "iceberg",
        "applied LSN",
        "last commit (UTC)",
        "rows",
        "data files",
        "delete files",
    )
    rows = [header]
    for t in status.tables:
        if not t.exists:
            rows.append((t.source, t.iceberg, "-", "not created yet", "-", "-", "-"))
            continue
        rows.append(
            (
                t.source,
                t.iceberg,
                t.applied_lsn or "-",
                t.last_commit.strftime("%Y-%m-%d %H:%M:%S") if t.last_commit else "-",
                _count(t.rows),
                _count(t.data_files),
                _count(t.delete_files),
            )
        )
    lines += _columns(rows, right={4, 5, 6})
    lines.append("")
    if status.prepared:
        lines += _columns(
            [("prepared gid", "xid", "prepare LSN", "since (UTC)")]
            + [
                (
                    p.gid or "''",
                    str(p.xid),
                    p.prepare_lsn,
                    p.since.strftime("%Y-%m-%d %H:%M:%S"),
                )
                for p in status.prepared
            ],
            right={1},
        )
    else:
        lines.append("prepared transactions: none pending")
    return "\n".join(lines)


def _render_run(run: RunStatus | None) -> str:
    if run is None:
        return "none has used this work_dir"
    text = {
        "gone": f"not running: process {run.pid} ended without stopping (killed?)",
        "stopped": f"stopped at {_when(run.since)}",
        "failed": f"stopped by an error at {_when(run.since)}: {run.error}",
        "retrying": f"retrying since {_when(run.since)} ({run.attempts} attempt(s)): {run.error}",
    }.get(run.state, f"{run.state} since {_when(run.since)} (pid {run.pid})")
    if run.last_batch is not None and run.state in ("streaming", "retrying"):
        text += f", last batch {_when(run.last_batch)}"
    return text


def _columns(rows: Sequence[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
