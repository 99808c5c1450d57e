"""Decoder throughput against pg_recvlogical on the same pgoutput stream.

    python bench/decode_bench.py [--rows 1000000] [--repeat 3]

Starts its own bundled PostgreSQL 16 in a temporary directory (normal settings:
``logical_decoding_work_mem=64MB``, ``debug_logical_replication_streaming=buffered``),
creates ``bench (id bigint primary key, a int, b text, c timestamptz, d numeric(12,2))``
and one slot per measurement, inserts ``--rows`` rows in ONE transaction, then:

(a) runs the bundled ``pg_recvlogical`` on a fresh slot, with the options our
    subscriber negotiates (proto_version 4, streaming parallel, two_phase on,
    messages on), ``--endpos`` = the LSN of the transaction's last message so that it
    exits by itself, writing to /dev/null. Best of ``--repeat`` runs (one slot each).
    This is the server's decode-and-send rate: the most our decoder will ever be fed.
(b) captures the same stream once through the SQL interface
    (``pg_logical_slot_get_binary_changes``) into a length-prefixed file, loads the
    payloads into memory and times ``Decoder.decode`` over all of them, best of
    ``--repeat``. Pure CPU, no I/O.

Both rates are computed over the same messages and the same payload bytes (the
XLogData headers pg_recvlogical also receives are not counted), so the ratio
decode / pg_recvlogical says how many times faster than the server can send it our
decoder decodes. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from sparkapply.embedded import EmbeddedPostgres
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import Decoder

SETTINGS = {
    "logical_decoding_work_mem": "64MB",
    "debug_logical_replication_streaming": "buffered",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "wal_sender_timeout": "0",
}
PUBLICATION = "bench_pub"
CAPTURE_SLOT = "bench_capture"
PLUGIN_OPTIONS = {
    "proto_version": "4",
    "publication_names": PUBLICATION,
    "streaming": "parallel",
    "two_phase": "on",
    "messages": "true",
}
_LEN = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Rate:
    seconds: float
    messages: int
    payload_bytes: int

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6


def log(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def prepare(conn: psycopg.Connection[tuple[object, ...]], rows: int, slots: Sequence[str]) -> Lsn:
    """Schema, slots, then the one big transaction; returns the LSN after its commit."""
    conn.execute(
        "CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12, 2))"
    )
    conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE bench")
    for slot in slots:
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", (slot,)
        )
    t = time.perf_counter()
    conn.execute(
        "INSERT INTO bench SELECT g, (g * 7919) %% 100000, md5(g::text),"
        " timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',"
        " (g %% 10000000) / 100.0 FROM generate_series(1, %s::bigint) g",
        (rows,),
    )
    log(f"inserted {rows:,} rows in one transaction in {time.perf_counter() - t:.1f}s")
    conn.execute("CHECKPOINT")  # the SQL interface decodes flushed WAL only
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(str(row[0]))


def capture(dsn: str, path: Path) -> tuple[int, int, Lsn]:
    """The whole stream of CAPTURE_SLOT into ``path`` as (uint32 length, payload)*.

    Returns (messages, payload bytes, LSN of the last message).
    """
    options = [x for kv in PLUGIN_OPTIONS.items() for x in kv]
    count = nbytes = 0
    last = Lsn(0)
    with psycopg.connect(dsn) as conn, open(path, "wb") as f:
        with conn.cursor(name="capture") as cur:
            cur.itersize = 20_000
            cur.execute(
                "SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes("
                "%s, NULL, NULL, VARIADIC %s::text[])",
                (CAPTURE_SLOT, options),
            )
            for lsn, data in cur:
                f.write(_LEN.pack(len(data)))
                f.write(data)
                count += 1
                nbytes += len(data)
                last = Lsn.parse(lsn)
        conn.commit()
    return count, nbytes, last


def load(path: Path) -> list[bytes]:
    data = path.read_bytes()
    out: list[bytes] = []
    pos, end = 0, len(data)
    unpack = _LEN.unpack_from
    while pos < end:
        (n,) = unpack(data, pos)
        pos += 4
        out.append(data[pos : pos + n])
        pos += n
    return out


def time_decoder(payloads: Sequence[bytes], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        dec = Decoder(proto_version=4, streaming="parallel")
        decode = dec.decode
        t = time.perf_counter()
        for p in payloads:
            decode(p)
        best = min(best, time.perf_counter() - t)
    return best


def time_recvlogical(server: EmbeddedPostgres, dsn: str, slot: str, endpos: Lsn) -> float:
    cmd = [str(server.binary("pg_recvlogical")), "-d", dsn, "--slot", slot, "--start"]
    cmd += ["--endpos", str(endpos), "-f", "/dev/null", "--no-loop", "-F", "0"]
    for key, value in PLUGIN_OPTIONS.items():
        cmd += ["-o", f"{key}={value}"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"pg_recvlogical failed ({proc.returncode}): {proc.stderr.strip()}")
    return elapsed


def confirmed_flush(dsn: str, slot: str) -> Lsn:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None and row[0] is not None
    return Lsn.parse(str(row[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    repeat = max(1, args.repeat)

    tmp = Path(tempfile.mkdtemp(prefix="sparkapply-bench-"))
    os.chmod(tmp, 0o755)
    server = EmbeddedPostgres(tmp / "data", settings=SETTINGS)
    server.start()
    try:
        dsn = server.dsn()
        recv_slots = [f"bench_recv_{i}" for i in range(repeat)]
        with psycopg.connect(dsn, autocommit=True) as conn:
            after_commit = prepare(conn, args.rows, [CAPTURE_SLOT, *recv_slots])

        t = time.perf_counter()
        path = tmp / "stream.bin"
        messages, nbytes, endpos = capture(dsn, path)
        capture_s = time.perf_counter() - t
        log(
            f"captured {messages:,} messages, {nbytes / 1e6:.1f} MB via SQL in {capture_s:.1f}s"
            f" (last message at {endpos}, WAL insert position {after_commit})"
        )
        if messages < args.rows:
            raise SystemExit(f"expected at least {args.rows} messages, got {messages}")

        recv_best = float("inf")
        for slot in recv_slots:
            elapsed = time_recvlogical(server, dsn, slot, endpos)
            confirmed = confirmed_flush(dsn, slot)
            log(f"pg_recvlogical ({slot}): {elapsed:.2f}s, confirmed up to {confirmed}")
            if confirmed < endpos:  # it must have received the whole stream
                raise SystemExit(f"pg_recvlogical stopped at {confirmed}, before {endpos}")
            recv_best = min(recv_best, elapsed)

        payloads = load(path)
        assert len(payloads) == messages
        decode_best = time_decoder(payloads, repeat)
        log(f"Decoder.decode best of {repeat}: {decode_best:.2f}s")
    finally:
        server.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)

    dec = Rate(decode_best, messages, nbytes)
    recv = Rate(recv_best, messages, nbytes)
    sql_capture = Rate(capture_s, messages, nbytes)
    print(
        f"rows {args.rows:,} in one transaction; {messages:,} messages, "
        f"{nbytes / 1e6:.1f} MB of pgoutput payload (best of {repeat})"
    )
    print(f"{'':<24}{'seconds':>10}{'msgs/s':>14}{'MB/s':>10}")
    rows = (
        ("Decoder.decode", dec),
        ("pg_recvlogical", recv),
        ("(SQL capture, 1 run)", sql_capture),
    )
    for name, r in rows:
        print(f"{name:<24}{r.seconds:>10.2f}{r.msgs_per_s:>14,.0f}{r.mb_per_s:>10.1f}")
    print(f"ratio decode/pg_recvlogical: {dec.msgs_per_s / recv.msgs_per_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
