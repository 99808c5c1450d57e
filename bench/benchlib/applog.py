"""sparkapply's own log, read from the outside: where a live process's time went.

``sparkapply run`` logs ``%(asctime)s %(levelname)s %(name)s: %(message)s`` on stderr
(``2026-11-24 11:03:40,123 INFO sparkapply.run.subscriber: applied ...``). A benchmark
that runs the real command line captures that stream into a file and reads it here:
each batch's acknowledgement line (transactions, changes, rows staged while they
arrived, tables, the batch's seconds on the apply thread, the flushed LSN), and the
lines between (maintenance, expiry, warnings), each at its time relative to an instant
the benchmark chose (the release of a frozen process).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ([A-Z]+) ([\w.\-]+): (.*)$")
_APPLIED = re.compile(
    r"applied (\d+) transactions \((\d+) changes(?:, (\d+) rows staged while they arrived)?\)"
    r" to (\d+) tables in ([\d.]+)s; flushed to (\S+)"
)
# "<name> 1.23s" or "<name>=1.23s" / "<name>=1.23": phases a batch line may carry.
_PHASE = re.compile(r"\b([a-z_]+)[ =]([\d]+\.[\d]+)s?\b")


@dataclass(frozen=True, slots=True)
class LogLine:
    at: float  # seconds since the epoch (the log's local time, ms resolution)
    level: str
    logger: str
    message: str


def parse_log(text: str) -> list[LogLine]:
    """Every record of the log; lines that do not start a record (tracebacks, Spark's
    console output) are appended to the record before them."""
    out: list[LogLine] = []
    for raw in text.splitlines():
        m = _LINE.match(raw)
        if m is None:
            if out:
                last = out[-1]
                out[-1] = LogLine(last.at, last.level, last.logger, f"{last.message}\n{raw}")
            continue
        stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
        out.append(LogLine(stamp + int(m.group(2)) / 1000, m.group(3), m.group(4), m.group(5)))
    return out


def batch_of(message: str) -> dict[str, Any] | None:
    """The figures of a batch's ``applied ...`` line, or None for any other line."""
    m = _APPLIED.search(message)
    if m is None:
        return None
    out: dict[str, Any] = {
        "transactions": int(m.group(1)),
        "changes": int(m.group(2)),
        "staged_rows": int(m.group(3) or 0),
        "tables": int(m.group(4)),
        "seconds": float(m.group(5)),
        "flushed": m.group(6),
    }
    rest = message[m.end() :]
    phases = {k: float(v) for k, v in _PHASE.findall(rest)}
    if phases:
        out["phases"] = phases
    return out


def timeline(lines: list[LogLine], since: float, until: float | None = None) -> dict[str, Any]:
    """The records from ``since`` (epoch seconds) to ``until``, at seconds relative to
    ``since``: the batches' figures and every other line's message (first line)."""
    batches: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    for line in lines:
        # The log's times have ms resolution: a record of the instant itself counts.
        if line.at < since - 0.001 or (until is not None and line.at > until):
            continue
        t = round(line.at - since, 3)
        batch = batch_of(line.message)
        if batch is not None:
            batches.append({"t": t, **batch})
        else:
            first = line.message.splitlines()[0] if line.message else ""
            other.append({"t": t, "level": line.level, "logger": line.logger, "message": first})
    return {
        "batches": batches,
        "batch_seconds": round(sum(b["seconds"] for b in batches), 3),
        "other": other,
    }


def split(batches: list[dict[str, Any]], seen_at: float) -> dict[str, float] | None:
    """A timed drain seen from outside, from the release (0) to the publisher seeing
    the target (``seen_at``), by the batches of ``timeline``: ``before_first_batch``
    (receiving and spooling until the first batch started), ``batches`` (their
    seconds on the apply thread), ``between_batches`` (the rest until the last
    acknowledgement was logged) and ``ack_to_publisher`` (from that log line until the
    publisher's slot showed the target). None without batches."""
    if not batches:
        return None
    first_start = batches[0]["t"] - batches[0]["seconds"]
    applying = sum(b["seconds"] for b in batches)
    last = batches[-1]["t"]
    return {
        "before_first_batch": round(first_start, 3),
        "batches": round(applying, 3),
        "between_batches": round(last - first_start - applying, 3),
        "ack_to_publisher": round(seen_at - last, 3),
    }
