"""Rendering ``sparkapply status`` (no server): the text table and the JSON."""

from __future__ import annotations

import datetime as dt
import json

from sparkapply.commands.status import (
    PreparedStatus,
    SlotStatus,
    Status,
    TableStatus,
    pg_timestamp,
    render_text,
    to_json,
)

WHEN = dt.datetime(2026, 11, 23, 18, 2, 11, tzinfo=dt.UTC)


def _status(slot: SlotStatus) -> Status:
    return Status(
        publisher="h:5432/db as u",
        slot=slot,
        tables=[
            TableStatus("public.t", "lake.t", True, "0/3A1BFE0", WHEN, 1_234_567, 7, 2),
            TableStatus("public.new", "public.new", False, None, None, None, None, None),
        ],
        prepared=[PreparedStatus("", 812, "0/3A1C100", WHEN)],
        spool_bytes=3 * 1024 * 1024,
        pending_skip="0/3A1C1A0",
    )


def test_text_names_every_part() -> None:
    slot = SlotStatus("s", True, True, 42, "0/3A1C2F8", "0/3A1D000", 3336, 20480, "reserved")
    text = render_text(_status(slot))
    assert "s: active (pid 42), confirmed 0/3A1C2F8, server at 0/3A1D000" in text
    assert "lag 3.3 KiB, WAL retained 20.0 KiB (reserved)" in text
    assert "spool      3.0 MiB" in text
    assert "skip       transaction at 0/3A1C1A0 (pending)" in text
    line = next(x for x in text.splitlines() if x.startswith("public.t "))
    expected = "public.t lake.t 0/3A1BFE0 2026-11-23 18:02:11 1,234,567 7 2"
    assert line.split() == expected.split()
    assert "not created yet" in text
    assert "''" in text and "812" in text  # an empty GID is shown as ''


def test_missing_slot_and_json() -> None:
    status = _status(SlotStatus("s", False))
    assert "s: does not exist" in render_text(status)
    data = json.loads(to_json(status))
    assert data["slot"] == {
        "name": "s",
        "exists": False,
        "active": False,
        "active_pid": None,
        "confirmed_lsn": None,
        "server_lsn": None,
        "lag_bytes": None,
        "retained_bytes": None,
        "wal_status": None,
    }
    assert data["tables"][0]["last_commit"] == "2026-11-23T18:02:11+00:00"
    assert data["tables"][0]["rows"] == 1_234_567
    assert data["prepared"][0]["xid"] == 812


def test_pg_timestamps_are_utc_from_2000() -> None:
    assert pg_timestamp(0) == dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    assert pg_timestamp(1_500_000) == dt.datetime(2000, 1, 1, 0, 0, 1, 500000, tzinfo=dt.UTC)
