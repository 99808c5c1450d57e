"""Decoder throughput against pg_recvlogical on the same pgoutput stream.

    python bench/decode_bench.py [--rows 1000000] [--repeat 3] [--out PATH] [--allow-dirty]

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
decoder decodes. With ``--out``, the figures also go to a JSON file. See bench/README.md.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from benchlib.cli import add_size_options, bench_parser, parse_bench_args
from benchlib.consumers import PLUGIN_OPTIONS, recvlogical
from benchlib.report import log, machine, print_table
from benchlib.servers import PUBLICATION, SETTINGS, create_slot, insert_lsn, scratch, server
from benchlib.workloads import BENCH, BENCH_DDL, DECODE_INSERT

from sparkapply.lsn import Lsn
from sparkapply.pgoutput import Decoder

CAPTURE_SLOT = "bench_capture"
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

    def as_json(self) -> dict[str, float]:
        return {
            "seconds": round(self.seconds, 3),
            "msgs_per_s": round(self.msgs_per_s),
            "mb_per_s": round(self.mb_per_s, 2),
        }


def prepare(dsn: str, rows: int, slots: Sequence[str]) -> Lsn:
    """Schema, slots, then the one big transaction; returns the LSN after its commit."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(BENCH_DDL)
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {BENCH}")
        for slot in slots:
            create_slot(dsn, slot)
        t = time.perf_counter()
        conn.execute(DECODE_INSERT, (1, rows))
        log(f"inserted {rows:,} rows in one transaction in {time.perf_counter() - t:.1f}s")
        conn.execute("CHECKPOINT")  # the SQL interface decodes flushed WAL only
        return insert_lsn(conn)


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


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    add_size_options(parser, rows=1_000_000, repeat=3)
    args, output = parse_bench_args(parser, argv, None, "decode.json")
    repeat = args.repeat

    with scratch("sparkapply-bench-") as tmp, server(tmp / "data", SETTINGS) as pg:
        dsn = pg.dsn()
        recv_slots = [f"bench_recv_{i}" for i in range(repeat)]
        after_commit = prepare(dsn, args.rows, [CAPTURE_SLOT, *recv_slots])

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

        recv_runs = []
        for slot in recv_slots:  # each checks it received the whole stream
            recv_runs.append(recvlogical(pg, slot, endpos))
            log(f"pg_recvlogical ({slot}): {recv_runs[-1]:.2f}s")

        payloads = load(path)
        assert len(payloads) == messages
        decode_best = time_decoder(payloads, repeat)
        log(f"Decoder.decode best of {repeat}: {decode_best:.2f}s")

    dec = Rate(decode_best, messages, nbytes)
    recv = Rate(min(recv_runs), messages, nbytes)
    sql_capture = Rate(capture_s, messages, nbytes)
    print(
        f"rows {args.rows:,} in one transaction; {messages:,} messages, "
        f"{nbytes / 1e6:.1f} MB of pgoutput payload (best of {repeat})"
    )
    rates = {
        "Decoder.decode": dec,
        "pg_recvlogical": recv,
        "(SQL capture, 1 run)": sql_capture,
    }
    columns = [("", "<24"), ("seconds", ">10.2f"), ("msgs/s", ">14,.0f"), ("MB/s", ">10.1f")]
    print_table(columns, [(k, r.seconds, r.msgs_per_s, r.mb_per_s) for k, r in rates.items()])
    ratio = dec.msgs_per_s / recv.msgs_per_s
    print(f"ratio decode/pg_recvlogical: {ratio:.2f}")
    report: dict[str, Any] = {
        "benchmark": "decode_bench",
        "rows": args.rows,
        "repeat": repeat,
        "machine": machine(),
        "settings": SETTINGS,
        "messages": messages,
        "payload_bytes": nbytes,
        "rates": {k: r.as_json() for k, r in rates.items()},
        "pg_recvlogical_seconds_runs": [round(s, 3) for s in recv_runs],
        "ratio_decode_pg_recvlogical": round(ratio, 3),
    }
    output.write(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
