"""The replication stream on a real server: bursts of whole XLogData frames."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator

import psycopg

from sparkapply.lsn import Lsn
from sparkapply.pgoutput import messages as m
from sparkapply.pgoutput.decoder import Decoder
from sparkapply.pgoutput.frames import XLOG_DATA_HEADER
from sparkapply.source.connection import RECEIVE_BUFFER, ReplicationConnection, hold_window
from sparkapply.source.negotiation import (
    Protocol,
    create_slot_command,
    start_replication_command,
)
from sparkapply.source.stream import BURST_LINGER_BELOW, BURST_PACE, ReplicationStream
from sparkapply.source.wakeup import Wakeup

TXNS = 400


@contextlib.contextmanager
def _stream_of(
    pg_dsn: str, *statements: str, columns: str = "id int PRIMARY KEY"
) -> Iterator[ReplicationStream]:
    """A stream from a new slot on table ``t`` (``columns``), after ``statements`` ran
    (one transaction each)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE t ({columns})".encode())
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    with ReplicationConnection(pg_dsn) as rc:
        rc.execute(create_slot_command("s", two_phase=False))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.encode())
        stream = ReplicationStream(rc)
        stream.start(
            start_replication_command("s", Lsn(0), ["pub"], Protocol(4, "parallel", False)),
            Lsn(0),
        )
        yield stream


def test_a_trickle_of_small_transactions_arrives_whole_and_in_order(pg_dsn: str) -> None:
    # 400 one-row transactions: the walsender flushes message by message, so most
    # bursts are small and wait (``BURST_LINGER``) for more. Nothing may be lost,
    # repeated or reordered across those waits.
    inserts = [f"INSERT INTO t VALUES ({i})" for i in range(TXNS)]
    with _stream_of(pg_dsn, *inserts) as stream:
        tags: list[str] = []
        starts: list[int] = []
        bursts: list[int] = []
        deadline = time.monotonic() + 60
        while tags.count("C") < TXNS and time.monotonic() < deadline:
            frames = stream.poll_burst(0.2)
            if frames:
                bursts.append(len(frames))
            for frame in frames:
                starts.append(XLOG_DATA_HEADER.unpack_from(frame)[1])
                tags.append(chr(frame[XLOG_DATA_HEADER.size]))
    changes = [t for t in tags if t != "R"]  # one RELATION before the first INSERT
    assert changes == ["B", "I", "C"] * TXNS
    positions = [s for s in starts if s]  # a RELATION message has no position
    assert positions == sorted(positions) and len(positions) >= 3 * TXNS
    assert stream.last_received >= max(positions)
    assert max(bursts) <= 20_000 and sum(bursts) == len(tags)
    assert min(bursts) < BURST_LINGER_BELOW  # the lingering path was taken


def test_the_stream_says_when_the_walsender_has_sent_what_there_is(pg_dsn: str) -> None:
    # After the last commit the walsender waits for WAL, and says so with a keepalive
    # it was not asked for: the stream is caught up without a read that finds
    # nothing (what the batch scheduler takes for the end of a backlog).
    inserts = [f"INSERT INTO t VALUES ({i})" for i in range(TXNS)]
    with _stream_of(pg_dsn, *inserts) as stream:
        deadline = time.monotonic() + 60
        assert not stream.caught_up
        assert _caught_up_after(stream, TXNS, deadline) == TXNS
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (-1)")
        assert _caught_up_after(stream, 1, deadline) == 1


def _caught_up_after(stream: ReplicationStream, commits: int, deadline: float) -> int:
    """Read until ``commits`` commits came and the stream is caught up; the commits
    received by then."""
    seen = 0
    while time.monotonic() < deadline:
        frames = stream.poll_burst(0.2)
        seen += sum(1 for f in frames if f[XLOG_DATA_HEADER.size] == ord("C"))
        if seen >= commits and stream.caught_up:
            return seen
    raise AssertionError(f"not caught up after {seen} commits")


def test_reads_of_a_flowing_stream_are_paced_and_lose_nothing(pg_dsn: str) -> None:
    # One 20,000-row transaction: data keeps flowing, so each read that took a burst
    # (short of the limit) is followed by the next no sooner than BURST_PACE after it
    # began; the socket fills meanwhile. Every row still arrives once and in order.
    rows = "INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g"
    with _stream_of(pg_dsn, rows, columns="id int PRIMARY KEY, pad text") as stream:
        rc = stream.conn
        limit = 5_000
        reads: list[tuple[float, int]] = []  # (when a read began, the frames it took)
        real_read = rc.read_burst

        def timed_read(
            timeout: float,
            limit: int,
            linger: float = 0.0,
            linger_below: int = 0,
            wakeup: Wakeup | None = None,
        ) -> list[memoryview]:
            began = time.monotonic()
            got = real_read(timeout, limit, linger, linger_below, wakeup)
            reads.append((began, len(got)))
            return got

        rc.read_burst = timed_read  # type: ignore[method-assign]
        decoder = Decoder(proto_version=4, streaming="parallel")
        ids: list[int] = []
        committed = False
        deadline = time.monotonic() + 60
        while not committed and time.monotonic() < deadline:
            for frame in stream.poll_burst(0.2, limit):
                msg = decoder.decode(frame[XLOG_DATA_HEADER.size :])
                if isinstance(msg, m.Insert):
                    key = msg.new.values[0]
                    assert isinstance(key, bytes)
                    ids.append(int(key))
                committed = committed or isinstance(msg, m.Commit | m.StreamCommit)
    assert committed
    assert ids == list(range(1, 20_001))
    paced = [
        later - earlier for (earlier, n), (later, _) in itertools.pairwise(reads) if 0 < n < limit
    ]
    assert paced, "no burst was followed by another read"
    assert min(paced) >= BURST_PACE


def test_a_durable_position_reaches_the_publisher_at_once(pg_dsn: str) -> None:
    """A batch made durable is reported with the next poll, even one right after the
    last status update (confirmed_flush_lsn is what users and lag monitors read)."""
    with _stream_of(pg_dsn, "INSERT INTO t SELECT generate_series(1, 10)") as stream:
        deadline = time.monotonic() + 60
        start = stream.last_received
        committed = False
        while not committed and time.monotonic() < deadline:
            frames = stream.poll_burst(0.2)
            committed = any(chr(f[XLOG_DATA_HEADER.size]) == "C" for f in frames)
        assert committed and stream.last_received > start
        stream.send_status()  # a status update just went out
        stream.set_flush_lsn(stream.last_received)
        stream.poll_burst(0.0)  # ... and at once the durable one, not 0.2 s later
        target = str(stream.last_received)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            confirmed = None
            while confirmed != target and time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
                    " WHERE slot_name = 's'"
                ).fetchone()
                confirmed = row[0] if row else None
                time.sleep(0.05)
        assert confirmed == target


def test_a_wakeup_ends_the_wait_for_the_walsender(pg_dsn: str) -> None:
    """A batch that completes while the receiving thread waits for the walsender (an
    idle stream: nothing comes) is seen at once: the wait ends when another thread
    sets the wakeup, not at its timeout, and the wake-up is taken by the poll."""
    with _stream_of(pg_dsn) as stream:
        while stream.poll_burst(0.2):  # the stream is idle once nothing is pending
            pass
        stream.wakeup = wakeup = Wakeup()
        try:
            returned = threading.Event()

            def wait() -> None:
                stream.conn.read_copy_data(300.0, wakeup)  # the walsender sends nothing
                returned.set()

            waiting = threading.Thread(target=wait, daemon=True)
            waiting.start()
            wakeup.set()
            assert returned.wait(120), "the wait did not end when the wakeup was set"
            waiting.join()
            assert stream.poll_burst(0.2) == []  # set still: it ends this poll's wait ...
            assert not wakeup.take()  # ... and the poll took it
        finally:
            wakeup.close()


def test_a_wakeup_set_before_a_wait_ends_it_once() -> None:
    wakeup = Wakeup()
    try:
        assert not wakeup.take()
        wakeup.set()
        wakeup.set()
        assert wakeup.wait(300.0)  # would sleep 300 s if the set were lost
        assert not wakeup.take()  # both sets were taken by that one wait
    finally:
        wakeup.close()
    wakeup.set()  # after close: nothing, no error


def test_the_socket_to_a_near_publisher_holds_a_small_receive_window(pg_dsn: str) -> None:
    """The walsender's sends should find the window closed between paced reads
    (connection.py, RECEIVE_BUFFER): the test server is on loopback, microseconds
    away, so its replication socket gets the fixed buffer (Linux doubles it)."""
    with _stream_of(pg_dsn) as stream:
        assert stream.conn.window_held
        sock = socket.socket(fileno=os.dup(stream.conn.fileno()))
        try:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) in (
                RECEIVE_BUFFER,
                2 * RECEIVE_BUFFER,
            )
        finally:
            sock.close()


def test_a_socket_that_is_not_tcp_keeps_the_kernels_buffer() -> None:
    left, right = socket.socketpair()
    with left, right:
        before = left.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert not hold_window(left.fileno())
        assert left.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == before
