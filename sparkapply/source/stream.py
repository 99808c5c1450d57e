"""The COPY BOTH loop: XLogData out to the caller, keepalives answered here.

The caller sets :attr:`ReplicationStream.flush_lsn` to what is durable; this module
never reports more. Keepalives that ask for a reply are answered at once, and a status
update is sent at least every ``status_interval`` seconds, so the walsender never times
out while Spark or Iceberg is busy: those run on other threads, this loop keeps reading.
"""

from __future__ import annotations

import logging
import threading
import time

from sparkapply.errors import ProtocolError
from sparkapply.lsn import Lsn
from sparkapply.pgoutput.frames import (
    PrimaryKeepalive,
    StandbyStatusUpdate,
    XLogData,
    parse_copy_data,
    pg_now_micros,
)
from sparkapply.source.connection import ReplicationConnection

log = logging.getLogger(__name__)


class ReplicationStream:
    def __init__(self, conn: ReplicationConnection, *, status_interval: float = 10.0) -> None:
        self.conn = conn
        self.status_interval = status_interval
        self._lock = threading.Lock()
        self._flush_lsn = Lsn(0)
        self.last_received = Lsn(0)  # highest wal_end seen in XLogData or keepalive
        self.last_keepalive_end = Lsn(0)
        self._last_status = 0.0
        self._reported = Lsn(0)

    @property
    def flush_lsn(self) -> Lsn:
        return self._flush_lsn

    def set_flush_lsn(self, lsn: int) -> None:
        """Raise the durable position; it never goes backwards."""
        with self._lock:
            if lsn > self._flush_lsn:
                self._flush_lsn = Lsn(lsn)

    def start(self, command: str, start: Lsn) -> None:
        self.set_flush_lsn(start)
        self.conn.start_copy_both(command)

    def poll(self, timeout: float) -> XLogData | None:
        """The next XLogData, or None after ``timeout`` s (keepalives handled here)."""
        deadline = time.monotonic() + timeout
        while True:
            self._maybe_send_status()
            remaining = max(0.0, deadline - time.monotonic())
            raw = self.conn.read_copy_data(min(remaining, 1.0))
            if raw is None:
                if time.monotonic() >= deadline:
                    return None
                continue
            try:
                frame = parse_copy_data(raw)
            except ProtocolError as exc:
                raise exc.with_context(lsn=self.last_received) from None
            if isinstance(frame, PrimaryKeepalive):
                if frame.wal_end > self.last_received:
                    self.last_received = Lsn(frame.wal_end)
                self.last_keepalive_end = Lsn(frame.wal_end)
                if frame.reply_requested:
                    self.send_status()
                continue
            if frame.wal_end > self.last_received:
                self.last_received = Lsn(frame.wal_end)
            return frame

    def _maybe_send_status(self) -> None:
        now = time.monotonic()
        due = now - self._last_status >= self.status_interval
        # A new durable position is worth telling at once (it frees WAL), but not
        # more often than every 100 ms.
        if due or (self._flush_lsn > self._reported and now - self._last_status >= 0.1):
            self.send_status()

    def send_status(self, reply_requested: bool = False) -> None:
        flush = self._flush_lsn
        msg = StandbyStatusUpdate(
            write_lsn=int(max(flush, self.last_received)),
            flush_lsn=int(flush),
            apply_lsn=int(flush),
            send_time=pg_now_micros(),
            reply_requested=reply_requested,
        )
        self.conn.send_copy_data(msg.encode())
        self._last_status = time.monotonic()
        self._reported = flush
