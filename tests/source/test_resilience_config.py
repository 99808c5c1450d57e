"""The source settings that decide how the mirror lives through a failover or a dead
connection: their values, defaults and errors, and what they put on the wire."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sparkapply.config import load_config
from sparkapply.errors import ConfigError
from sparkapply.source.connection import session_conninfo
from sparkapply.source.negotiation import alter_slot_failover_command, create_slot_command

BASE = '[source]\ndsn = "host=x"\npublication = "p"\n'


def _source(tmp_path: Path, extra: str = "") -> object:
    path = tmp_path / "c.toml"
    path.write_text(BASE + extra)
    return load_config(path, env={}).source


def test_defaults_follow_postgresql_s_own_subscriber(tmp_path: Path) -> None:
    src = load_config(None, env={}, overrides={"source": {"dsn": "host=x", "publication": "p"}})
    assert src.source.receive_timeout == 60.0  # wal_receiver_timeout's default
    assert src.source.missing_slot == "copy"
    assert src.source.failover == "auto"
    assert src.source.failover_for(170000) and src.source.failover_for(180004)
    assert not src.source.failover_for(160004)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [("failover = true\n", (True, True)), ("failover = false\n", (False, False))],
)
def test_failover_can_be_forced_either_way(
    tmp_path: Path, extra: str, expected: tuple[bool, bool]
) -> None:
    src = _source(tmp_path, extra)
    assert (src.failover_for(170000), src.failover_for(160000)) == expected  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('failover = "yes"\n', "source.failover"),
        ('missing_slot = "ignore"\n', "source.missing_slot"),
        ("receive_timeout = -1\n", "source.receive_timeout"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, extra: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _source(tmp_path, extra)
    assert err.value.context["key"] == key


def test_receive_timeout_zero_turns_the_check_off(tmp_path: Path) -> None:
    assert _source(tmp_path, "receive_timeout = 0\n").receive_timeout == 0.0  # type: ignore[attr-defined]


def test_slot_commands() -> None:
    assert create_slot_command("m", two_phase=True, snapshot="export", failover=True) == (
        "CREATE_REPLICATION_SLOT \"m\" LOGICAL pgoutput (SNAPSHOT 'export', TWO_PHASE true, "
        "FAILOVER true)"
    )
    assert "FAILOVER" not in create_slot_command("m", two_phase=True)
    assert alter_slot_failover_command('a"b') == 'ALTER_REPLICATION_SLOT "a""b" (FAILOVER true)'


def test_sessions_keep_tcp_alive_unless_the_dsn_says_otherwise() -> None:
    given = psycopg.conninfo.conninfo_to_dict(session_conninfo("host=x"))
    assert (given["keepalives"], given["keepalives_idle"]) == ("1", "30")
    own = psycopg.conninfo.conninfo_to_dict(session_conninfo("host=x keepalives_idle=5"))
    assert own["keepalives_idle"] == "5" and own["keepalives_count"] == "3"
