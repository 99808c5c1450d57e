"""A live run read from the outside: where its time went.

Each batch's figures (transactions, changes, rows staged while they arrived, tables,
the batch's seconds on the apply thread and their phases, the flushed LSN) come from
the product's own record, ``work_dir/logs/batches.jsonl`` (sparkapply/state/batch_log.py),
never from its log text, whose wording may change. The log (``%(asctime)s %(levelname)s
%(name)s: %(message)s`` on stderr, captured by the benchmark) gives the lines between
(maintenance, expiry, warnings). Everything is timed relative to an instant the
benchmark chose (the release of a frozen process).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ([A-Z]+) ([\w.\-]+): (.*)$")


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


def batches_of(
    records: list[dict[str, Any]], since: float, until: float | None = None
) -> list[dict[str, Any]]:
    """The product's batch records (``work_dir/logs/batches.jsonl``, read with
    ``sparkapply.state.batch_log.read_batch_log``) acknowledged from ``since`` (epoch
    seconds) to ``until``, each at ``t``: seconds relative to ``since``."""
    out = []
    for record in records:
        # A record of the instant itself counts (times of ms resolution elsewhere).
        if record["at"] < since - 0.001 or (until is not None and record["at"] > until):
            continue
        out.append({"t": round(record["at"] - since, 3), **record})
    return out


def timeline(
    lines: list[LogLine],
    records: list[dict[str, Any]],
    since: float,
    until: float | None = None,
) -> dict[str, Any]:
    """From ``since`` (epoch seconds) to ``until``, at seconds relative to ``since``:
    the batches, from the product's records, and every other log line's message (its
    first line); the log's own line for each batch is left out."""
    batches = batches_of(records, since, until)
    other: list[dict[str, Any]] = []
    for line in lines:
        if line.at < since - 0.001 or (until is not None and line.at > until):
            continue
        if line.logger == "sparkapply.run.subscriber" and line.message.startswith("applied "):
            continue
        first = line.message.splitlines()[0] if line.message else ""
        t = round(line.at - since, 3)
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
