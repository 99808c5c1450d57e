"""Protocol negotiation and quoting of replication commands."""

from __future__ import annotations

import pytest

from sparkapply.errors import ServerVersionError
from sparkapply.lsn import Lsn
from sparkapply.source.negotiation import (
    Protocol,
    create_slot_command,
    negotiate,
    start_replication_command,
)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (170002, Protocol(4, "parallel", True)),
        (160002, Protocol(4, "parallel", True)),
        (150007, Protocol(3, "on", True)),
        (140011, Protocol(2, "on", False)),
    ],
)
def test_negotiate(version: int, expected: Protocol) -> None:
    assert negotiate(version) == expected


def test_old_server_is_refused_with_version() -> None:
    with pytest.raises(ServerVersionError, match="PostgreSQL 13") as info:
        negotiate(130012)
    assert "14 or newer" in str(info.value)


def test_start_replication_quotes_identifiers_and_literals() -> None:
    cmd = start_replication_command(
        'my"slot', Lsn.parse("1/2"), ["pub one", "o'brien"], Protocol(4, "parallel", True)
    )
    assert cmd.startswith('START_REPLICATION SLOT "my""slot" LOGICAL 1/2 (')
    assert '"publication_names" \'"pub one","o\'\'brien"\'' in cmd
    assert "\"streaming\" 'parallel'" in cmd and "\"two_phase\" 'on'" in cmd
    assert "\"origin\" 'any'" in cmd


def test_protocol_2_sends_no_two_phase_or_origin() -> None:
    cmd = start_replication_command("s", Lsn(0), ["p"], Protocol(2, "on", False))
    assert "two_phase" not in cmd and "origin" not in cmd
    assert "\"proto_version\" '2'" in cmd


def test_create_slot_command() -> None:
    assert create_slot_command('a"b', two_phase=True, snapshot="export") == (
        'CREATE_REPLICATION_SLOT "a""b" LOGICAL pgoutput (SNAPSHOT \'export\', TWO_PHASE true)'
    )
