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

from sparkapply.errors import ConnectionLostError, ProtocolError
from sparkapply.lsn import Lsn
from sparkapply.pgoutput.frames import (
    XLOG_DATA_HEADER,
    XLOG_DATA_TAG,
    PrimaryKeepalive,
    StandbyStatusUpdate,
    parse_copy_data,
    pg_now_micros,
)
from sparkapply.source.connection import ReplicationConnection
from sparkapply.source.wakeup import Wakeup

log = logging.getLogger(__name__)

STATUS_MIN_INTERVAL = 0.2  # seconds between status updates sent because a position moved
# A burst smaller than this waits once, this long, for more (``read_burst``): 1 ms is
# about 100 messages of a walsender that decodes an UPDATE-heavy stream, and far less
# than what loopback's socket buffer holds, so the walsender never waits on us.
BURST_LINGER = 0.001
BURST_LINGER_BELOW = 1_000
# While data flows, a read starts no sooner than this after the previous one began.
# A walsender sends every message on its own (TCP_NODELAY), and a reader that keeps
# the socket empty makes each of those sends a whole TCP segment: on a 1,000,000-row
# UPDATE, 800,000 segments, and the walsender spent 5.6 s of its 7.5 s in the kernel,
# most of it in sendto. Reading every 20 ms lets the socket fill, so its sends queue
# behind a closed window and leave in large segments: about 100,000 segments, the
# walsender's kernel time 2.9 s, and the stream arrives in 5 s instead of 7.5 s.
# PostgreSQL's own apply worker gets this for free by being slower than its
# walsender. The cost is at most 20 ms of latency while a backlog drains; an idle
# stream is still read the moment something arrives.
BURST_PACE = 0.02


class ReplicationStream:
    def __init__(
        self,
        conn: ReplicationConnection,
        *,
        status_interval: float = 10.0,
        wakeup: Wakeup | None = None,
        receive_timeout: float = 0.0,
    ) -> None:
        self.conn = conn
        self.receive_timeout = receive_timeout  # see DEAD CONNECTIONS below
        self._heard = time.monotonic()  # when the walsender last sent anything
        self._pinged = False
        # Set by another thread (a batch that completed) to end a poll's wait at once.
        self.wakeup = wakeup
        self.status_interval = status_interval
        self._lock = threading.Lock()
        self._flush_lsn = Lsn(0)
        self.last_received = Lsn(0)  # highest wal_end seen in XLogData or keepalive
        self._last_status = 0.0
        self._reported = Lsn(0)
        self._reported_write = Lsn(0)
        self._next_read = 0.0  # monotonic time before which a read waits (BURST_PACE)
        self.caught_up = False  # see below

    # ``caught_up``: the last thing received was a keepalive the walsender sent
    # unasked. It sends one whenever its decoding reaches the end of the WAL that was
    # flushed when it last looked (WalSndWaitForWal), before it looks again and
    # either goes on or waits: at the end of a backlog, and at times inside one
    # (a backlog that grows while it is sent). XLogData since clears it. The batch
    # scheduler reads it as a pause: without it, the end of a backlog was known only
    # when a read found nothing, up to 50 ms later. A keepalive that asks for a
    # reply is the walsender's timeout, sent whether or not data waits. Read wrong,
    # a batch is cut sooner than it would be; nothing else depends on it.

    # DEAD CONNECTIONS. A partition, a NAT or a load balancer that forgets the flow
    # drops packets without a reset: the socket stays open and reads find nothing,
    # exactly as on an idle publisher. So, as PostgreSQL's apply worker does with
    # wal_receiver_timeout, after half of ``receive_timeout`` without a message we ask
    # for a reply (a live walsender answers a status update that requests one at once),
    # and after all of it the connection is dead: ConnectionLostError, a transient
    # error, ends the session and a new one starts from the slot's confirmed position.
    # Our own status updates do not count as hearing from the server.

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
        self._heard = time.monotonic()

    def poll_burst(self, timeout: float, limit: int = 20_000) -> list[memoryview]:
        """Every XLogData frame already received, whole (its :data:`XLOG_DATA_HEADER`
        then the pgoutput message), waiting up to ``timeout`` s for the first;
        keepalives are handled here.

        The per-message cost is what bounds a large transaction's receive rate, so an
        XLogData frame costs a tag check and an append: only the last frame's
        ``wal_end`` is read (positions only grow), and status bookkeeping is done once
        per burst. While data flows, reads are paced (:data:`BURST_PACE`); a burst
        that reached ``limit`` is followed at once. A set :attr:`wakeup` ends the
        waits, for the pace or the first frame, at once.
        """
        self._maybe_send_status()
        timeout = min(timeout, 1.0)
        wait = self._next_read - time.monotonic()
        wakeup = self.wakeup
        if wait > 0:
            if wakeup is None:
                time.sleep(min(wait, timeout))
            elif wakeup.wait(min(wait, timeout)):
                timeout = 0.0  # woken: what has arrived, and back to the caller
        began = time.monotonic()
        raws = self.conn.read_burst(timeout, limit, BURST_LINGER, BURST_LINGER_BELOW, wakeup)
        if wakeup is not None:
            # The caller looks at what woke it next: a wake-up from now on ends the
            # next poll's wait.
            wakeup.take()
        self._next_read = began + BURST_PACE if 0 < len(raws) < limit else 0.0
        if raws:
            self._heard = time.monotonic()
            self._pinged = False
        elif self.receive_timeout:
            self._check_alive()
        out: list[memoryview] = []
        size = XLOG_DATA_HEADER.size
        idle_after = -1  # XLogData frames before the walsender's last unasked keepalive
        for raw in raws:
            if len(raw) >= size and raw[0] == XLOG_DATA_TAG:
                out.append(raw)
            else:
                self._note_received(out)
                if self._frame(raw):
                    idle_after = len(out)
        self._note_received(out)
        if idle_after == len(out):
            self.caught_up = True
        elif out:
            self.caught_up = False
        return out

    def _check_alive(self) -> None:
        silent = time.monotonic() - self._heard
        if silent >= self.receive_timeout:
            raise ConnectionLostError(
                f"no message from the publisher {self.conn.where} for {silent:.0f} s: the "
                "connection is taken for dead ([source] receive_timeout)",
                hint="a new connection is made; if this repeats, check the network to the "
                "publisher, or raise receive_timeout",
            )
        if silent >= self.receive_timeout / 2 and not self._pinged:
            self.send_status(reply_requested=True)
            self._pinged = True

    def _note_received(self, frames: list[memoryview]) -> None:
        if frames:
            wal_end = XLOG_DATA_HEADER.unpack_from(frames[-1])[2]
            if wal_end > self.last_received:
                self.last_received = Lsn(wal_end)

    def _frame(self, raw: memoryview) -> bool:
        """A frame other than XLogData; True for a keepalive sent unasked."""
        try:
            frame = parse_copy_data(raw)
        except ProtocolError as exc:
            raise exc.with_context(lsn=self.last_received) from None
        if isinstance(frame, PrimaryKeepalive):
            if frame.wal_end > self.last_received:
                self.last_received = Lsn(frame.wal_end)
            if frame.reply_requested:
                self.send_status()
            return not frame.reply_requested
        # an XLogData too short for its header: parse_copy_data said so
        raise ProtocolError("XLogData message shorter than its header", tag="w")

    def _maybe_send_status(self) -> None:
        now = time.monotonic()
        due = now - self._last_status >= self.status_interval
        # As PostgreSQL's apply worker does: tell the server whenever what we received
        # or made durable moved, at most every STATUS_MIN_INTERVAL s. While a large
        # backlog streams in, its keepalive requests sit behind data in the socket;
        # these updates are what keep a short wal_sender_timeout from firing.
        # A durable position that moved is sent at once: the publisher's view of what
        # the mirror holds (confirmed_flush_lsn, what users and lag monitors read)
        # must not trail a committed batch by STATUS_MIN_INTERVAL. At most once per
        # batch, or per keepalive while idle.
        durable = self._flush_lsn > self._reported
        moved = durable or self.last_received > self._reported_write
        if due or durable or (moved and now - self._last_status >= STATUS_MIN_INTERVAL):
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
        self._reported_write = Lsn(msg.write_lsn)
