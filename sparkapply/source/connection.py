"""The connections to the publisher: the replication connection, and :func:`connect`.

The replication connection is libpq in ``replication=database`` mode via ``psycopg.pq``.
It owns the socket. It runs replication commands, then drives COPY BOTH:
``read_copy_data`` waits at most ``timeout`` seconds for one CopyData message,
``send_copy_data`` writes one. Any libpq failure becomes :class:`ConnectionLostError`
(transient) unless the server said something an operator must fix.

:func:`connect` is the one way to open a plain SQL session on the publisher (the
preflight, ``status``, ``skip``, ``resync``, ``verify``). The connection string is
never logged, nor put in an error: errors name the server as :func:`describe_dsn` does.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from typing import Any

import psycopg
from psycopg import pq

from sparkapply.errors import ConnectionLostError, PrivilegeError, SourceError
from sparkapply.source.wakeup import Wakeup

# As PostgreSQL's own walreceiver sets them, so the text output of every type is
# stable and lossless whatever the server's defaults are.
SESSION_OPTIONS = (
    "-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3 -c TimeZone=UTC "
    "-c bytea_output=hex"
)


def session_conninfo(
    dsn: str, *, application_name: str | None = None, options: str = "", **params: str
) -> str:
    """``dsn`` with what every sparkapply session needs: UTF8, :data:`SESSION_OPTIONS`
    after the user's own ``options`` (then ``options``), and ``application_name``
    (default: the user's, else "sparkapply"); ``params`` are further keywords."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    all_options = " ".join(
        o for o in (str(given.get("options") or ""), SESSION_OPTIONS, options) if o
    )
    keepalives = {k: v for k, v in KEEPALIVES.items() if k not in given}
    return psycopg.conninfo.make_conninfo(
        dsn,
        client_encoding="UTF8",
        application_name=application_name or str(given.get("application_name") or "sparkapply"),
        options=all_options,
        **keepalives,
        **params,
    )


# TCP keepalives on every session unless the DSN sets its own: the kernel's defaults
# (two hours idle) leave a COPY or a catalog query waiting forever on a peer that a
# partition or a forgetful NAT took away without a reset.
KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}


def replication_conninfo(dsn: str, *, connect_timeout: float = 10.0) -> str:
    return session_conninfo(
        dsn, replication="database", connect_timeout=str(max(1, int(connect_timeout)))
    )


def describe_dsn(dsn: str) -> str:
    """host:port/dbname as user; for messages (never the password)."""
    try:
        p = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable connection string>"
    host, port = p.get("host", "localhost"), p.get("port", 5432)
    return f"{host}:{port}/{p.get('dbname', '?')} as {p.get('user', '?')}"


def connect(
    dsn: str,
    *,
    application_name: str | None = None,
    autocommit: bool = True,
    connect_timeout: float = 10.0,
) -> psycopg.Connection[tuple[Any, ...]]:
    """A SQL session (not a walsender) on the publisher, with what every sparkapply
    session needs (:func:`session_conninfo`). A failure to connect is a
    :class:`SourceError` that names the server (host, port, database, user), never
    the password or the connection string: no retry here, an operator checks the DSN."""
    conninfo = session_conninfo(
        dsn,
        application_name=application_name,
        connect_timeout=str(max(1, int(connect_timeout))),
    )
    try:
        return psycopg.connect(conninfo, autocommit=autocommit)
    except psycopg.OperationalError as exc:
        raise SourceError(
            f"cannot connect to the publisher {describe_dsn(dsn)}: {str(exc).strip()}",
            hint="check [source] dsn",
        ) from exc


# The receive buffer of a replication socket to a publisher under a millisecond away.
# A walsender makes one send() per message; one that finds the receive window open
# sends each as a TCP segment of its own, and the reader keeps the window open by
# draining the socket at every read (stream.py, BURST_PACE). A 1,000,000-row UPDATE
# cost its walsender 6.2 s of CPU serving sparkapply against 4.8 s serving native,
# for the same 1,000,000 sends. With 256 KiB (the kernel doubles it) the window
# closes between reads: in alternating rounds the update drained in 4.62-4.87 s
# against 5.08-5.81 s, the walsender at 4.0-4.4 s against 4.6-5.1 s of CPU
# (bench/README.md). A size set on a socket turns the kernel's autotuning off and caps
# a stream at the buffer per round trip: 500 MB/s at a millisecond, a few MB/s across
# a WAN, where autotuning is left alone.
RECEIVE_BUFFER = 256 * 1024
NEAR_RTT_US = 1_000
_TCP_INFO_RTT_AT = 68  # offset of tcpi_rtt (µs, a native u32) in Linux's struct tcp_info


def hold_window(fd: int) -> bool:
    """Give a TCP socket to a publisher under :data:`NEAR_RTT_US` away a receive
    buffer of :data:`RECEIVE_BUFFER`; True if it was given one. Any other socket (a
    Unix-domain one, a far publisher, a platform without ``TCP_INFO``) is left as the
    kernel tunes it."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        if len(info) < _TCP_INFO_RTT_AT + 4:
            return False
        (rtt,) = struct.unpack_from("=I", info, _TCP_INFO_RTT_AT)
        if rtt >= NEAR_RTT_US:
            return False
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        return True
    except (OSError, AttributeError):  # not TCP, or no TCP_INFO here
        return False
    finally:
        sock.close()


def _connection_lost(sqlstate: str) -> bool:
    """Class 08 (connection exception) and the server ending the session (57P01 admin
    shutdown, e.g. pg_terminate_backend; 57P02 crash shutdown; 57P03 cannot connect now):
    a new connection may work, so these are transient."""
    return sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03")


class ReplicationConnection:
    """One walsender connection. Not thread-safe: the receiving thread owns it."""

    def __init__(self, dsn: str, *, connect_timeout: float = 10.0) -> None:
        self._where = describe_dsn(dsn)
        conninfo = replication_conninfo(dsn, connect_timeout=connect_timeout)
        pgconn = pq.PGconn.connect(conninfo.encode())
        if pgconn.status != pq.ConnStatus.OK:
            msg = pgconn.error_message.decode(errors="replace").strip()
            pgconn.finish()
            if "permission denied to start WAL sender" in msg:
                # No retry fixes a missing privilege: stop and say what to grant.
                raise PrivilegeError(
                    f"cannot open a replication connection to {self._where}: {msg}",
                    hint="as a superuser on the publisher: ALTER ROLE <user> WITH REPLICATION",
                )
            raise ConnectionLostError(
                f"cannot open a replication connection to {self._where}: {msg}",
                hint="check [source] dsn, pg_hba.conf (a 'replication' line is not needed "
                "for replication=database) and that the user has the REPLICATION attribute",
            )
        self._pgconn = pgconn
        self.server_version: int = pgconn.server_version
        self.window_held = False  # see hold_window, at START_REPLICATION

    @property
    def where(self) -> str:
        return self._where

    def fileno(self) -> int:
        """The connection's socket."""
        return self._pgconn.socket

    def close(self) -> None:
        if self._pgconn is not None:
            self._pgconn.finish()

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands --------------------------------------------------------------------

    def execute(self, command: str) -> list[dict[str, str | None]]:
        """Run one command (replication or SQL) and return its rows as text."""
        res = self._pgconn.exec_(command.encode())
        status = res.status
        if status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.EMPTY_QUERY):
            return []
        if status != pq.ExecStatus.TUPLES_OK:
            self._raise_from(res, command.split(" ", 1)[0])
        names = [(res.fname(i) or b"").decode() for i in range(res.nfields)]
        rows = []
        for r in range(res.ntuples):
            row: dict[str, str | None] = {}
            for c, name in enumerate(names):
                v = res.get_value(r, c)
                row[name] = None if v is None else bytes(v).decode()
            rows.append(row)
        return rows

    def _raise_from(self, res: pq.abc.PGresult, what: str) -> None:
        msg = (res.error_message or self._pgconn.error_message).decode(errors="replace").strip()
        sqlstate = res.error_field(pq.DiagnosticField.SQLSTATE)
        code = sqlstate.decode() if sqlstate else ""
        if self._pgconn.status != pq.ConnStatus.OK or _connection_lost(code):
            raise ConnectionLostError(f"{what} on {self._where} failed: {msg}")
        raise SourceError(f"{what} on {self._where} failed: {msg}", sqlstate=code or None)

    def start_copy_both(self, command: str) -> None:
        self._pgconn.send_query(command.encode())
        res = self._pgconn.get_result()
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            if res is None:
                raise ConnectionLostError(f"no answer to START_REPLICATION from {self._where}")
            self._raise_from(res, "START_REPLICATION")
        self._pgconn.nonblocking = 1
        self.window_held = hold_window(self.fileno())

    # -- COPY BOTH -------------------------------------------------------------------

    def read_copy_data(self, timeout: float, wakeup: Wakeup | None = None) -> memoryview | None:
        """One CopyData payload, or None if nothing arrived within ``timeout`` s (or
        before ``wakeup`` was set: it is left set, for the caller to take)."""
        nbytes, data = self._get()
        if nbytes > 0:
            return data
        if nbytes == 0:
            # Read what the kernel already has before deciding to wait.
            self._consume()
            nbytes, data = self._get()
            if nbytes > 0:
                return data
        if nbytes == 0 and timeout > 0:
            fd = self.fileno()
            waits: list[int | Wakeup] = [fd] if wakeup is None else [fd, wakeup]
            ready, _, _ = select.select(waits, [], [], timeout)
            if fd in ready:
                self._consume()
                nbytes, data = self._get()
                if nbytes > 0:
                    return data
        if nbytes == -1:
            self._copy_ended()
        return None

    def read_burst(
        self,
        timeout: float,
        limit: int,
        linger: float = 0.0,
        linger_below: int = 0,
        wakeup: Wakeup | None = None,
    ) -> list[memoryview]:
        """Every CopyData payload already received, up to ``limit``, waiting up to
        ``timeout`` s for the first; [] if none came.

        One call per burst, not per message: a large transaction arrives as millions of
        messages, and each call layer costs as much as libpq's copy itself. A burst of
        fewer than ``linger_below`` payloads waits ``linger`` s once and takes what came
        meanwhile: a walsender that decodes slower than we read flushes every message
        on its own, and without the wait each burst is a handful of messages that pays
        a whole loop of the caller (measured: 7 per burst, 6.4 µs of CPU per message
        on a 1,000,000-row UPDATE, against 2 on a bulk INSERT). A set ``wakeup`` ends
        the wait for the first."""
        first = self.read_copy_data(timeout, wakeup)
        if first is None:
            return []
        out = [first]
        get = self._pgconn.get_copy_data
        consumed = False
        lingered = linger <= 0
        nbytes = 1
        try:
            while len(out) < limit:
                nbytes, data = get(1)
                if nbytes > 0:
                    out.append(data)
                    consumed = False
                elif nbytes == 0 and not consumed:
                    self._pgconn.consume_input()  # what the kernel already has
                    consumed = True
                elif nbytes == 0 and not lingered and len(out) < linger_below:
                    lingered = True
                    time.sleep(linger)
                    consumed = False
                else:
                    break
        except psycopg.OperationalError as exc:
            raise self._broken(exc) from exc
        if nbytes == -2:
            raise self._broken()
        if nbytes == -1:
            self._copy_ended()
        return out

    def _get(self) -> tuple[int, memoryview]:
        try:
            nbytes, data = self._pgconn.get_copy_data(1)
        except psycopg.OperationalError as exc:
            raise self._broken(exc) from exc
        if nbytes == -2:
            raise self._broken()
        return nbytes, data

    def _broken(self, why: object = None) -> ConnectionLostError:
        """The stream broke: ``why``, or else what libpq says."""
        detail = why if why is not None else self._pgconn.error_message.decode(errors="replace")
        return ConnectionLostError(f"replication stream from {self._where} broke: {detail}")

    def _consume(self) -> None:
        try:
            self._pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise self._broken(exc) from exc

    def _copy_ended(self) -> None:
        res = self._pgconn.get_result()
        if res is not None and res.status == pq.ExecStatus.FATAL_ERROR:
            self._raise_from(res, "replication stream")
        raise ConnectionLostError(f"the server ended the replication stream ({self._where})")

    def send_copy_data(self, payload: bytes) -> None:
        try:
            self._pgconn.put_copy_data(payload)
            while self._pgconn.flush() == 1:
                select.select([], [self.fileno()], [], 1.0)
        except psycopg.OperationalError as exc:
            raise ConnectionLostError(f"cannot write to {self._where}: {exc}") from exc
