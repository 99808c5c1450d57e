"""The replication stream on a real server: bursts of whole XLogData frames."""

from __future__ import annotations

import time

import psycopg

from sparkapply.lsn import Lsn
from sparkapply.pgoutput.frames import XLOG_DATA_HEADER
from sparkapply.source.connection import ReplicationConnection
from sparkapply.source.negotiation import (
    Protocol,
    create_slot_command,
    start_replication_command,
)
from sparkapply.source.stream import BURST_LINGER_BELOW, ReplicationStream

TXNS = 400


def test_a_trickle_of_small_transactions_arrives_whole_and_in_order(pg_dsn: str) -> None:
    # 400 one-row transactions: the walsender flushes message by message, so most
    # bursts are small and wait (``BURST_LINGER``) for more. Nothing may be lost,
    # repeated or reordered across those waits.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    with ReplicationConnection(pg_dsn) as rc:
        rc.execute(create_slot_command("s", two_phase=False))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for i in range(TXNS):
                conn.execute("INSERT INTO t VALUES (%s)", (i,))
        stream = ReplicationStream(rc)
        stream.start(
            start_replication_command("s", Lsn(0), ["pub"], Protocol(4, "parallel", False)),
            Lsn(0),
        )
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
