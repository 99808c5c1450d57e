"""Config precedence, types and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkapply.config import ApplyConfig, load_config
from sparkapply.errors import ConfigError

BASE = '[source]\ndsn = "host=x"\npublication = "p"\n'


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_shipped_local_config_loads() -> None:
    cfg = load_config(Path(__file__).parent.parent / "configs" / "local.toml", env={})
    assert cfg.spark.master == "local[2]"
    # What the shipped file spells out is the default, so that a copy of it behaves
    # as a config without the key.
    assert cfg.apply == ApplyConfig()
    props = cfg.catalog_properties()
    assert props["uri"] == f"sqlite:///{cfg.work_dir}/catalog.db"
    assert "{work_dir}" not in props["warehouse"]


def test_precedence_file_env_overrides(tmp_path: Path) -> None:
    p = write(tmp_path, BASE + 'slot = "from_file"\n[spark]\nmaster = "local[1]"\n')
    env = {"SPARKAPPLY_SOURCE__SLOT": "from_env", "SPARKAPPLY_APPLY__BATCH_LINGER": "2"}
    cfg = load_config(p, env=env, overrides={"spark": {"master": "local[3]"}})
    assert cfg.source.slot == "from_env"
    assert cfg.apply.batch_linger == 2.0
    assert cfg.spark.master == "local[3]"
    assert cfg.source.publication == ("p",)


def test_env_list_value_and_free_form_key(tmp_path: Path) -> None:
    env = {
        "SPARKAPPLY_SOURCE__PUBLICATION": '["a", "b"]',
        "SPARKAPPLY_SPARK__CONF__spark.sql.x": "1",
    }
    cfg = load_config(write(tmp_path, BASE), env=env)
    assert cfg.source.publication == ("a", "b")
    assert cfg.spark.conf["spark.sql.x"] == "1"


def test_env_names_a_shell_accepts_for_dotted_catalog_keys(tmp_path: Path) -> None:
    # Every name here is a valid POSIX shell identifier but the old, as-written form.
    env = {
        "SPARKAPPLY_SINK__CATALOG__S3__SECRET_ACCESS_KEY": "1e5",
        "SPARKAPPLY_SINK__CATALOG__S3__ACCESS_KEY_ID": "0x1F",
        "SPARKAPPLY_SINK__CATALOG__PY_IO_IMPL": "pyiceberg.io.pyarrow.PyArrowFileIO",
        "SPARKAPPLY_SINK__CATALOG__credential": "id:secret",
        "SPARKAPPLY_SINK__CATALOG__s3.region": "eu-west-3",
    }
    catalog = load_config(write(tmp_path, BASE), env=env).sink.catalog
    assert dict(catalog) == {
        "s3.secret-access-key": "1e5",  # a string as written: not the float 100000.0
        "s3.access-key-id": "0x1F",  # not 31
        "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
        "credential": "id:secret",
        "s3.region": "eu-west-3",
    }


def test_env_json_table_for_any_key_and_a_key_variable_wins(tmp_path: Path) -> None:
    env = {
        "SPARKAPPLY_SPARK__CONF": '{"spark.executor.extraJavaOptions": "-Xss4m", "n": 2}',
        "SPARKAPPLY_SINK__CATALOG": '{"s3.secret-access-key": "from-json", "uri": "u"}',
        "SPARKAPPLY_SINK__CATALOG__S3__SECRET_ACCESS_KEY": "from-key",
    }
    cfg = load_config(write(tmp_path, BASE), env=env)
    assert dict(cfg.spark.conf) == {"spark.executor.extraJavaOptions": "-Xss4m", "n": "2"}
    assert dict(cfg.sink.catalog) == {"s3.secret-access-key": "from-key", "uri": "u"}
    with pytest.raises(ConfigError, match="SPARKAPPLY_SINK__CATALOG must hold a JSON") as caught:
        load_config(write(tmp_path, BASE), env={"SPARKAPPLY_SINK__CATALOG": "hunter2"})
    assert "hunter2" not in str(caught.value)


def test_env_values_are_strings_unless_the_key_is_typed(tmp_path: Path) -> None:
    env = {
        "SPARKAPPLY_SOURCE__DSN": "host=x password=1e5",
        "SPARKAPPLY_SOURCE__SLOT": "1e5",
        "SPARKAPPLY_SOURCE__PUBLICATION": "true",  # str or list: a name
        "SPARKAPPLY_SOURCE__CREATE_SLOT": "false",
        "SPARKAPPLY_APPLY__BATCH_MAX_BYTES": "1024",
        "SPARKAPPLY_WORK_DIR": "1e5",
    }
    cfg = load_config(write(tmp_path, BASE), env=env)
    assert cfg.source.slot == "1e5" and cfg.source.publication == ("true",)
    assert cfg.source.create_slot is False and cfg.apply.batch_max_bytes == 1024
    assert cfg.work_dir.name == "1e5"
    with pytest.raises(ConfigError, match=r"apply\.batch_max_bytes"):
        load_config(write(tmp_path, BASE), env={"SPARKAPPLY_APPLY__BATCH_MAX_BYTES": "lots"})


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (BASE + "bogus = 1\n", "source.bogus"),
        (BASE + "status_interval = 'soon'\n", "source.status_interval"),
        (BASE + "status_interval = -1\n", "source.status_interval"),
        ('[source]\npublication = "p"\n', "source.dsn"),
        ('[source]\ndsn = "x"\npublication = []\n', "source.publication"),
        ('[source]\ndsn = "x"\npublication = "p"\n', "source.dsn"),
        (BASE + "[apply]\nbatch_max_bytes = 0\n", "apply.batch_max_bytes"),
        (BASE + '[sink.tables]\n"public.t" = "no_dot"\n', "sink.tables.public.t"),
        ("work_dir = 3\n" + BASE, "work_dir"),
        ("nonsense = 1\n" + BASE, "nonsense"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.context["key"] == key


def test_unknown_env_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"source\.nope"):
        load_config(write(tmp_path, BASE), env={"SPARKAPPLY_SOURCE__NOPE": "1"})


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[source\n"), env={})


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (BASE + "[apply]\nbatch_linger = -0.5\n", "apply.batch_linger"),
        (BASE + "[apply]\nbatch_max_transactions = -1\n", "apply.batch_max_transactions"),
        (BASE + "connect_timeout = -3\n", "source.connect_timeout"),
        (BASE + "reconnect_max_backoff = 0\n", "source.reconnect_max_backoff"),
        (BASE + "[sink]\nretain_snapshots = -1\n", "sink.retain_snapshots"),
        (BASE + "[metrics]\nport = -1\n", "metrics.port"),
        (BASE + "[metrics]\nport = 70000\n", "metrics.port"),
        (BASE + "[metrics]\nhost = 5\n", "metrics.host"),
    ],
)
def test_negative_durations_and_sizes_are_rejected(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.context["key"] == key


def test_zero_linger_is_allowed(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE + "[apply]\nbatch_linger = 0\n"), env={})
    assert cfg.apply.batch_linger == 0.0


def test_malformed_dsn_names_the_key_and_not_the_string(tmp_path: Path) -> None:
    text = '[source]\ndsn = "host=h password=s3cret x"\npublication = "p"\n'
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.context["key"] == "source.dsn"
    assert "[source] dsn" in str(info.value)
    assert "s3cret" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_metrics_are_off_by_default_and_loopback(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE), env={})
    assert cfg.metrics.port is None
    cfg = load_config(write(tmp_path, BASE + "[metrics]\nport = 8723\n"), env={})
    assert (cfg.metrics.port, cfg.metrics.host) == (8723, "127.0.0.1")


def test_shipped_local_config_serves_metrics_on_loopback() -> None:
    cfg = load_config(Path(__file__).parent.parent / "configs" / "local.toml", env={})
    assert cfg.metrics.port == 8723 and cfg.metrics.host == "127.0.0.1"


@pytest.mark.parametrize(
    "catalog",
    ['type = "sql"\nuri = "sqlite:///{work_dir}/c.db"', 'uri = "sqlite:///{work_dir}/c.db"'],
)
def test_a_sql_catalog_without_a_warehouse_keeps_its_tables_in_the_work_dir(
    tmp_path: Path, catalog: str
) -> None:
    """pyiceberg's SQL catalog with no warehouse opens, then creates no table ("No
    default path is set"): the run would stop at its first table."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from sparkapply.location import from_path
    from sparkapply.sink.catalog import open_catalog
    from sparkapply.sink.tables import ensure_table

    text = f'work_dir = "{tmp_path}/w"\n{BASE}[sink.catalog]\n{catalog}\n'
    cfg = load_config(write(tmp_path, text), env={})
    props = cfg.catalog_properties()
    assert props["warehouse"] == from_path(cfg.work_dir / "warehouse")
    table = ensure_table(
        open_catalog("t", props), ("ns", "t"), Schema(NestedField(1, "id", LongType()))
    )
    assert table.location().startswith(props["warehouse"])


def test_a_warehouse_given_or_another_catalog_is_left_as_it_is(tmp_path: Path) -> None:
    given = '[sink.catalog]\ntype = "sql"\nuri = "sqlite:///x.db"\nwarehouse = "s3://b/w"\n'
    cfg = load_config(write(tmp_path, BASE + given), env={})
    assert cfg.catalog_properties()["warehouse"] == "s3://b/w"
    rest = '[sink.catalog]\ntype = "rest"\nuri = "http://catalog:8181"\n'
    assert "warehouse" not in load_config(write(tmp_path, BASE + rest), env={}).catalog_properties()
