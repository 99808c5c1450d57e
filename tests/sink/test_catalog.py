from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest

from sparkapply.errors import LocationError, SinkError
from sparkapply.sink import mask_properties, open_catalog

SECRET = "hunter2-s3cr3t"


class LeakyCatalog:
    """A catalog implementation whose error echoes every property, as pyiceberg's own
    ``load_catalog`` does for some configuration errors."""

    def __init__(self, name: str, **properties: Any) -> None:
        raise ValueError(f"cannot initialise catalog {name} with {properties}")


def test_creates_sqlite_directory_and_warehouse(tmp_path: Path) -> None:
    db = tmp_path / "a" / "b" / "catalog.db"
    warehouse = tmp_path / "wh" / "nested"
    props = {"type": "sql", "uri": f"sqlite:///{db}", "warehouse": str(warehouse)}
    catalog = open_catalog("t", props)
    assert db.exists()
    assert warehouse.is_dir()
    # A plain path is handed to pyiceberg as an absolute file URI.
    assert catalog.properties["warehouse"] == f"file://{warehouse}"


def test_file_uri_warehouse_is_created(tmp_path: Path) -> None:
    warehouse = tmp_path / "wh"
    open_catalog(
        "t",
        {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{warehouse}"},
    )
    assert warehouse.is_dir()


def test_failure_is_a_sink_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(SinkError) as info:
        open_catalog("broken", {"type": "sql", "warehouse": str(tmp_path)})
    err = info.value
    assert err.context["catalog"] == "broken"
    assert err.hint is not None and "catalog properties" in err.hint


def test_secrets_never_appear_in_errors_or_tracebacks(tmp_path: Path) -> None:
    props = {
        "py-catalog-impl": f"{__name__}.LeakyCatalog",
        "uri": f"postgresql+psycopg://app:{SECRET}@127.0.0.1:1/cat",
        "s3.secret-access-key": SECRET + "-key",
        "token": SECRET + "-token",
        "warehouse": str(tmp_path),
    }
    with pytest.raises(SinkError) as info:
        open_catalog("leaky", props)
    rendered = "".join(traceback.format_exception(info.value))
    assert "cannot initialise catalog" in rendered
    assert SECRET not in rendered
    assert info.value.__cause__ is None  # the original, leaking error is not chained


def test_sql_connection_failure_masks_the_uri_password(tmp_path: Path) -> None:
    props = {
        "type": "sql",
        "uri": f"postgresql+psycopg://app:{SECRET}@127.0.0.1:1/cat",
        "warehouse": str(tmp_path),
    }
    with pytest.raises(SinkError) as info:
        open_catalog("pg", props)
    rendered = "".join(traceback.format_exception(info.value))
    assert SECRET not in rendered


def test_mask_properties() -> None:
    masked = mask_properties(
        {
            "uri": "postgresql://app:pw@db/cat",
            "s3.access-key-id": "AKIA",
            "s3.secret-access-key": "x",
            "adls.account-key": "y",
            "credential": "id:secret",
            "rest.sigv4-enabled": "true",
            "warehouse": "s3://bucket/wh",
        }
    )
    assert masked == {
        "uri": "postgresql://app:***@db/cat",
        "s3.access-key-id": "***",
        "s3.secret-access-key": "***",
        "adls.account-key": "***",
        "credential": "***",
        "rest.sigv4-enabled": "true",
        "warehouse": "s3://bucket/wh",
    }


def test_hint_names_the_real_config_keys(tmp_path: Path) -> None:
    with pytest.raises(SinkError) as info:
        open_catalog("broken", {"type": "sql", "warehouse": str(tmp_path)})
    hint = info.value.hint or ""
    assert "[sink.catalog]" in hint and "[sink] catalog_name" in hint
    assert "[iceberg]" not in hint


def test_warehouse_with_spaces_brackets_and_non_ascii(tmp_path: Path) -> None:
    warehouse = tmp_path / "wörk [0] x" / "warehouse"
    catalog = open_catalog(
        "t", {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": str(warehouse)}
    )
    assert warehouse.is_dir()
    assert catalog.properties["warehouse"] == f"file://{warehouse}"


def test_warehouse_that_readers_cannot_parse_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LocationError, match="warehouse") as info:
        open_catalog(
            "t", {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": "/tmp/a#b"}
        )
    assert info.value.context["catalog"] == "t"
