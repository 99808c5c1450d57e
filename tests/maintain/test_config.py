"""``[maintenance]`` keys: defaults, file and environment, and errors naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from sparkapply.config import MaintenanceConfig, load_config
from sparkapply.errors import ConfigError

SOURCE = {"source": {"dsn": "host=x", "publication": "p"}}


def load(maintenance: dict[str, Any], env: dict[str, str] | None = None) -> MaintenanceConfig:
    return load_config(
        None, env=env or {}, overrides={**SOURCE, "maintenance": maintenance}
    ).maintenance


def test_defaults() -> None:
    m = load({})
    assert m == MaintenanceConfig()
    assert m.target_file_size == 128 * 1024 * 1024 and m.orphan_grace_seconds == 86400.0


def test_values_from_the_environment() -> None:
    m = load(
        {},
        {
            "SPARKAPPLY_MAINTENANCE__RETAIN_SNAPSHOTS": "7",
            "SPARKAPPLY_MAINTENANCE__ENABLED": "false",
        },
    )
    assert m.retain_snapshots == 7 and m.enabled is False
    assert load({"retain_seconds": 5}).retain_seconds == 5.0
    assert load({"driver_compact_bytes": 0}).driver_compact_bytes == 0


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("retain_snapshots", 0, "at least 1"),
        ("max_data_files", 0, "positive"),
        ("target_file_size", -1, "positive"),
        ("max_delete_ratio", 1.5, r"\(0, 1\]"),
        ("file_delete_ratio", 0, r"\(0, 1\]"),
        ("orphan_grace_seconds", -1, "0 or more"),
        ("driver_compact_bytes", -1, r"0 \(always a Spark job\) or more"),
        ("enabled", "yes", "must be bool"),
        ("compact", True, "unknown configuration key maintenance.compact"),
    ],
)
def test_bad_values_name_the_key(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load({key: value})
    assert info.value.context["key"] == f"maintenance.{key}"
