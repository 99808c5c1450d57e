"""The typed configuration: TOML file, then ``SPARKAPPLY_*`` environment, then flags.

Precedence (later wins): defaults → the TOML file → environment variables → command
line overrides. An environment variable names a key path with ``__`` between levels:
``SPARKAPPLY_SOURCE__DSN``, ``SPARKAPPLY_WORK_DIR``, ``SPARKAPPLY_SPARK__CONF__spark.ui.enabled``.
Unknown keys and bad values raise :class:`~sparkapply.errors.ConfigError` naming the key.

NAMES A SHELL ACCEPTS
    A POSIX shell's variable names hold letters, digits and ``_`` only, so a dotted
    pyiceberg property cannot be written as it is. Two forms can, for every key:

    - in ``[sink.catalog]``, a key in upper case is read as pyiceberg reads its own
      ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables: lower-cased, ``__`` → ``.``,
      ``_`` → ``-``: ``SPARKAPPLY_SINK__CATALOG__S3__SECRET_ACCESS_KEY`` sets
      ``s3.secret-access-key`` (:func:`catalog_key`). A key with a lower-case letter is
      used as written (``SPARKAPPLY_SINK__CATALOG__credential``, where a shell allows it);
    - a variable naming a whole free-form table (``SPARKAPPLY_SINK__CATALOG``,
      ``SPARKAPPLY_SPARK__CONF``, ``SPARKAPPLY_SINK__TABLES``) holds a JSON object of
      its keys, spelled as in the file.

VALUES
    A value from the environment is a string, as written, unless the key is typed in
    the schema below as something else: then it is read as a TOML value (``2``,
    ``true``, ``["a", "b"]``). So a secret ``1e5`` or ``0x1F`` stays that string.

``{work_dir}`` in any ``[sink.catalog]`` value is replaced by the absolute work dir, so
the shipped ``configs/local.toml`` keeps its catalog and warehouse beside the spool;
it is percent-escaped inside a URL such as ``sqlite:///{work_dir}/catalog.db`` and
used as it is in a path or ``file:`` location (:func:`sparkapply.location.expand_work_dir`).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from sparkapply.errors import ConfigError
from sparkapply.location import expand_work_dir, from_path

ENV_PREFIX = "SPARKAPPLY_"
NOT_KEYS = frozenset({"SPARKAPPLY_CONFIG"})
"""Variables of sparkapply's that name no config key (the command line reads them)."""


@dataclass(frozen=True, slots=True)
class SourceConfig:
    dsn: str
    publication: tuple[str, ...]
    slot: str = "sparkapply"
    create_slot: bool = True
    origin: str = "any"  # "any" or "none": which origins' changes to receive
    status_interval: float = 10.0  # seconds between unsolicited standby status updates
    connect_timeout: float = 10.0
    reconnect_max_backoff: float = 30.0
    # Seconds without any message from the walsender before the connection is taken
    # for dead and made again (PostgreSQL's wal_receiver_timeout); 0: never.
    receive_timeout: float = 60.0
    # Create the slot as a failover slot (PostgreSQL 17+): "auto" (on from 17), or a bool.
    failover: bool | str = "auto"
    # A missing slot while the mirror holds copied tables: "copy" everything again (with
    # a warning), or "stop" with exit 2 for an operator to decide.
    missing_slot: str = "copy"

    def failover_for(self, server_version: int) -> bool:
        """Whether the slot is to be a failover slot on a server of this version."""
        if self.failover == "auto":
            return server_version >= 170000
        return bool(self.failover)


@dataclass(frozen=True, slots=True)
class SinkConfig:
    catalog_name: str = "sparkapply"
    catalog: Mapping[str, str] = field(default_factory=dict)
    # "pgschema.pgtable" → "namespace.table"; unmapped tables keep their own name.
    tables: Mapping[str, str] = field(default_factory=dict)
    # Snapshots kept per table (older ones are expired; 0 keeps all).
    retain_snapshots: int = 100
    # Commit a batch's tables in one catalog transaction where the catalog can (SQL).
    atomic_commit: bool = True
    # The Iceberg table of cuts (sink/cuts.py), "namespace.table"; "" records none.
    cuts_table: str = "sparkapply.cuts"


@dataclass(frozen=True, slots=True)
class SparkConfig:
    master: str = "local[*]"
    app_name: str = "sparkapply"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ApplyConfig:
    batch_max_bytes: int = 256 * 1024 * 1024  # spooled bytes that close a batch
    batch_max_transactions: int = 100_000
    # Seconds the oldest ready transaction waits for more. Short: under a steady load
    # batches gather while the one before runs (group commit), so the linger only
    # delays the first batch of a backlog, and the rest of the backlog then arrives
    # while it is applied (bench/README.md, the race's mixed workload: 0.5 s → 0.05 s).
    batch_linger: float = 0.05
    # A table whose batch spooled at least split_bytes is folded by several tasks (key
    # hash partitions), at most max_tasks_per_table (0: Spark's default parallelism).
    split_bytes: int = 16 * 1024 * 1024
    max_tasks_per_table: int = 0
    # A batch whose tasks read at most driver_fold_bytes of spool in all is folded on
    # the driver, in this process, not as a Spark job (0: always a Spark job). See
    # apply/job.py, SMALL BATCHES, for the measurements behind the default.
    driver_fold_bytes: int = 16 * 1024 * 1024
    # A streamed transaction is staged by Spark tasks while it arrives, a piece of at
    # least stage_bytes at a time (0: never), with at most stage_inflight_bytes of
    # pieces in flight (see staging/stager.py).
    stage_bytes: int = 16 * 1024 * 1024
    stage_inflight_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    # The Prometheus endpoint's port; None (the default) serves no metrics, 0 picks a
    # free port (logged). Loopback unless ``host`` says otherwise: the metrics name
    # tables and positions, which is nothing to publish to a network by default.
    port: int | None = None
    host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class MaintenanceConfig:
    """``[maintenance]``: compaction, manifest merge, expiry, orphan sweep (``maintain/``)."""

    enabled: bool = True  # run due maintenance between batches
    target_file_size: int = 128 * 1024 * 1024  # bytes of a compacted data file
    max_data_files: int = 64  # compact when a table has more live data files
    max_delete_files: int = 16  # ... or more position-delete files
    max_delete_ratio: float = 0.1  # ... or more deleted rows per row in its data files
    file_delete_ratio: float = 0.2  # a data file with this share of rows deleted is rewritten
    max_manifests: int = 32  # merge manifests when a snapshot has more
    # A compaction whose tasks read at most driver_compact_bytes of files in all runs
    # on the driver, in the maintenance thread, not as a Spark job (0: always a Spark
    # job). See maintain/compact.py, SMALL COMPACTIONS.
    driver_compact_bytes: int = 16 * 1024 * 1024
    retain_snapshots: int = 100  # the newest snapshots expiry keeps
    retain_seconds: float = 3600.0  # ... and every snapshot younger than this
    orphan_grace_seconds: float = 86400.0  # unreferenced files younger than this are kept
    orphan_interval_seconds: float = 3600.0  # how often the run loop sweeps a table


@dataclass(frozen=True, slots=True)
class Config:
    source: SourceConfig
    work_dir: Path
    sink: SinkConfig = field(default_factory=SinkConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    apply: ApplyConfig = field(default_factory=ApplyConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)

    def table_identifier(self, schema: str, table: str) -> tuple[str, str]:
        """The Iceberg identifier of a published table (``[sink.tables]`` renames)."""
        mapped = self.sink.tables.get(f"{schema}.{table}")
        if mapped:
            ns, name = mapped.split(".", 1)
            return ns, name
        return schema, table

    def catalog_properties(self) -> dict[str, str]:
        """``[sink.catalog]`` with ``{work_dir}`` expanded. A SQL catalog given no
        warehouse gets ``work_dir/warehouse``: pyiceberg's would create no table."""
        props = {k: expand_work_dir(v, self.work_dir) for k, v in self.sink.catalog.items()}
        if is_sql_catalog(props) and not props.get("warehouse"):
            props["warehouse"] = from_path(self.work_dir / "warehouse")
        return props


def is_sql_catalog(props: Mapping[str, str]) -> bool:
    """A pyiceberg SQL catalog (``type = "sql"``, or no type and a SQLAlchemy uri): the
    one kind whose ``warehouse`` is a location sparkapply may make. Others (REST, Glue,
    Hive…) get theirs as written: a REST warehouse is a name the server resolves."""
    kind = props.get("type", "").lower()
    if kind in ("sql", "in-memory"):
        return True
    return not kind and props.get("uri", "").startswith(("sqlite", "postgresql"))


_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "": {"work_dir": str},
    "source": {
        "dsn": str,
        "publication": (str, list),
        "slot": str,
        "create_slot": bool,
        "origin": str,
        "status_interval": (int, float),
        "connect_timeout": (int, float),
        "reconnect_max_backoff": (int, float),
        "receive_timeout": (int, float),
        "failover": (bool, str),
        "missing_slot": str,
    },
    "sink": {
        "catalog_name": str,
        "catalog": dict,
        "tables": dict,
        "retain_snapshots": int,
        "atomic_commit": bool,
        "cuts_table": str,
    },
    "spark": {"master": str, "app_name": str, "conf": dict},
    "apply": {
        "batch_max_bytes": int,
        "batch_max_transactions": int,
        "batch_linger": (int, float),
        "split_bytes": int,
        "max_tasks_per_table": int,
        "driver_fold_bytes": int,
        "stage_bytes": int,
        "stage_inflight_bytes": int,
    },
    "metrics": {"port": int, "host": str},
    "maintenance": {
        "enabled": bool,
        "target_file_size": int,
        "max_data_files": int,
        "max_delete_files": int,
        "max_delete_ratio": (int, float),
        "file_delete_ratio": (int, float),
        "max_manifests": int,
        "driver_compact_bytes": int,
        "retain_snapshots": int,
        "retain_seconds": (int, float),
        "orphan_grace_seconds": (int, float),
        "orphan_interval_seconds": (int, float),
    },
}


# The free-form tables: their keys are anyone's (pyiceberg's, Spark's), their values strings.
_FREE_FORM = {("sink", "catalog"), ("sink", "tables"), ("spark", "conf")}


def catalog_key(name: str) -> str:
    """A ``[sink.catalog]`` key as an environment variable spells it: one in upper case
    is read as pyiceberg reads ``PYICEBERG_CATALOG__…`` (``S3__SECRET_ACCESS_KEY`` →
    ``s3.secret-access-key``); any other is used as written."""
    if name != name.upper():
        return name
    return name.lower().replace("__", ".").replace("_", "-")


def _parse_env_value(path: list[str], raw: str) -> Any:
    """A string, unless the schema types the key as something else (see VALUES)."""
    section, key = (path[0], path[1]) if len(path) == 2 else ("", path[0])
    expected = _SCHEMA.get(section, {}).get(key) if len(path) <= 2 else None
    if expected is None or expected is str or expected is dict:
        return raw
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # the type check names the key
    types = expected if isinstance(expected, tuple) else (expected,)
    # A key that may be a string keeps the string when TOML reads another type.
    return raw if str in types and not isinstance(value, types) else value


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # A whole table's JSON first: a variable naming one of its keys wins over it.
    for name, raw in sorted(env.items(), key=lambda item: item[0].count("__")):
        if not name.startswith(ENV_PREFIX) or name in NOT_KEYS:
            continue
        if name.startswith(ENV_PREFIX + "TEST_"):
            continue
        parts = name[len(ENV_PREFIX) :].split("__")
        # Section and key names are lower case; keys inside free-form tables keep case.
        head = [p.lower() for p in parts[:2]]
        if tuple(head) in _FREE_FORM and len(parts) > 2:
            _set(out, [*head, _free_key(head, "__".join(parts[2:]))], raw)
        elif tuple(head) in _FREE_FORM:
            for key, value in _json_table(name, raw).items():
                _set(out, [*head, key], value)
        else:
            path = head + parts[2:]
            _set(out, path, _parse_env_value(path, raw))
    return out


def _free_key(table: list[str], key: str) -> str:
    return catalog_key(key) if table == ["sink", "catalog"] else key


def _json_table(name: str, raw: str) -> dict[str, str]:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        # The value may be a secret: not quoted.
        raise ConfigError(
            f"environment variable {name} must hold a JSON object of keys and values",
            key=name,
            hint=f'e.g. {name}=\'{{"s3.secret-access-key": "..."}}\'',
        )
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


def _set(out: dict[str, Any], path: list[str], value: Any) -> None:
    node = out
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _check(raw: Mapping[str, Any], origin: str) -> None:
    for key, value in raw.items():
        if key in _SCHEMA and key != "":
            if not isinstance(value, Mapping):
                raise ConfigError(f"[{key}] must be a table", key=key, hint=origin)
            allowed = _SCHEMA[key]
            for sub, subval in value.items():
                if sub not in allowed:
                    raise ConfigError(
                        f"unknown configuration key {key}.{sub}",
                        key=f"{key}.{sub}",
                        hint=f"known keys of [{key}]: {', '.join(sorted(allowed))} ({origin})",
                    )
                _check_type(f"{key}.{sub}", subval, allowed[sub], origin)
        elif key in _SCHEMA[""]:
            _check_type(key, value, _SCHEMA[""][key], origin)
        else:
            known = sorted([*_SCHEMA[""], *(k for k in _SCHEMA if k)])
            raise ConfigError(
                f"unknown configuration key {key}",
                key=key,
                hint=f"known top-level keys: {', '.join(known)} ({origin})",
            )


def _check_type(key: str, value: Any, expected: type | tuple[type, ...], origin: str) -> None:
    types = expected if isinstance(expected, tuple) else (expected,)
    ok = not (isinstance(value, bool) and bool not in types) and isinstance(value, types)
    if not ok:
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(
            f"configuration key {key} must be {names}, got {type(value).__name__} {value!r}",
            key=key,
            hint=origin,
        )


def _str_table(key: str, value: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, Mapping | list):
            raise ConfigError(f"{key}.{k} must be a scalar", key=f"{key}.{k}")
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Config:
    """Read the config file (if any) over ``defaults`` (a command's own, such as the
    demo's), then apply environment and command-line overrides."""
    raw: dict[str, Any] = {}
    origin = "defaults"
    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {p}", key="--config") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}", key="--config") from exc
        origin = f"in {p}"
        _check(raw, origin)
    if defaults:
        _check(defaults, "in the command's defaults")
        raw = _merge(dict(defaults), raw)
    from_env = _env_overrides(os.environ if env is None else env)
    _check(from_env, "from SPARKAPPLY_* environment variables")
    raw = _merge(raw, from_env)
    if overrides:
        _check(overrides, "from the command line")
        raw = _merge(raw, overrides)
    return _build(raw)


def _build(raw: Mapping[str, Any]) -> Config:
    # Section by section, in this order: the first bad key found is the one reported.
    source = _source(dict(raw.get("source", {})))
    sink = _sink(dict(raw.get("sink", {})))
    spark_raw = dict(raw.get("spark", {}))
    spark = SparkConfig(
        master=spark_raw.get("master", "local[*]"),
        app_name=spark_raw.get("app_name", "sparkapply"),
        conf=_str_table("spark.conf", spark_raw.get("conf", {})),
    )
    apply = _apply(dict(raw.get("apply", {})))
    metrics = _metrics(dict(raw.get("metrics", {})))
    maintenance = _maintenance(dict(raw.get("maintenance", {})))
    work_dir = Path(raw.get("work_dir", ".sparkapply")).expanduser().absolute()
    return Config(
        source=source,
        work_dir=work_dir,
        sink=sink,
        spark=spark,
        apply=apply,
        metrics=metrics,
        maintenance=maintenance,
    )


def _source(src: dict[str, Any]) -> SourceConfig:
    if "dsn" not in src:
        raise ConfigError("[source] dsn is required", key="source.dsn")
    pubs = src.get("publication")
    if pubs is None:
        raise ConfigError("[source] publication is required", key="source.publication")
    pub_tuple = (pubs,) if isinstance(pubs, str) else tuple(pubs)
    if not pub_tuple or not all(isinstance(p, str) and p for p in pub_tuple):
        raise ConfigError(
            "[source] publication must be a non-empty name or list of names",
            key="source.publication",
        )
    src["publication"] = pub_tuple
    _check_dsn(src["dsn"])
    if src.get("origin", "any") not in ("any", "none"):
        raise ConfigError("source.origin must be 'any' or 'none'", key="source.origin")
    for key in ("status_interval", "connect_timeout", "reconnect_max_backoff"):
        if key in src:
            src[key] = float(src[key])
            if src[key] <= 0:
                raise ConfigError(f"source.{key} must be positive", key=f"source.{key}")
    if "receive_timeout" in src:
        src["receive_timeout"] = float(src["receive_timeout"])
        if src["receive_timeout"] < 0:
            raise ConfigError(
                "source.receive_timeout must be 0 (never) or positive",
                key="source.receive_timeout",
            )
    if isinstance(src.get("failover"), str) and src["failover"] != "auto":
        raise ConfigError(
            "source.failover must be true, false or 'auto' (on for PostgreSQL 17+)",
            key="source.failover",
        )
    if src.get("missing_slot", "copy") not in ("copy", "stop"):
        raise ConfigError("source.missing_slot must be 'copy' or 'stop'", key="source.missing_slot")
    return SourceConfig(**src)


def _sink(sink_raw: dict[str, Any]) -> SinkConfig:
    sink = SinkConfig(
        catalog_name=sink_raw.get("catalog_name", "sparkapply"),
        catalog=_str_table("sink.catalog", sink_raw.get("catalog", {})),
        tables=_str_table("sink.tables", sink_raw.get("tables", {})),
        retain_snapshots=sink_raw.get("retain_snapshots", 100),
        atomic_commit=sink_raw.get("atomic_commit", True),
        cuts_table=sink_raw.get("cuts_table", "sparkapply.cuts"),
    )
    if sink.cuts_table and sink.cuts_table.count(".") != 1:
        raise ConfigError(
            f"sink.cuts_table {sink.cuts_table!r} must be 'namespace.table' (or empty)",
            key="sink.cuts_table",
        )
    if sink.retain_snapshots < 0:
        raise ConfigError("sink.retain_snapshots must be 0 or more", key="sink.retain_snapshots")
    for pg_name, ice_name in sink.tables.items():
        for name, key in ((pg_name, "key"), (ice_name, "value")):
            if name.count(".") != 1:
                raise ConfigError(
                    f"sink.tables {key} {name!r} must be 'schema.table'",
                    key=f"sink.tables.{pg_name}",
                )
    return sink


def _apply(apply_raw: dict[str, Any]) -> ApplyConfig:
    if "batch_linger" in apply_raw:
        apply_raw["batch_linger"] = float(apply_raw["batch_linger"])
        # 0 is allowed: cut a batch as soon as a transaction is ready.
        if apply_raw["batch_linger"] < 0:
            raise ConfigError(
                "apply.batch_linger must be 0 or more seconds", key="apply.batch_linger"
            )
    for key, value in apply_raw.items():
        if key == "max_tasks_per_table" and value < 0:
            raise ConfigError(
                "apply.max_tasks_per_table must be 0 (Spark's parallelism) or more",
                key="apply.max_tasks_per_table",
            )
        if key in ("stage_bytes", "driver_fold_bytes") and value < 0:
            raise ConfigError(f"apply.{key} must be 0 (never) or more", key=f"apply.{key}")
        zero_allowed = ("batch_linger", "max_tasks_per_table", "stage_bytes", "driver_fold_bytes")
        if value <= 0 and key not in zero_allowed:
            raise ConfigError(f"apply.{key} must be positive", key=f"apply.{key}")
    return ApplyConfig(**apply_raw)


def _metrics(metrics_raw: dict[str, Any]) -> MetricsConfig:
    metrics = MetricsConfig(**metrics_raw)
    if metrics.port is not None and not 0 <= metrics.port <= 65535:
        raise ConfigError(
            f"metrics.port must be 0..65535, got {metrics.port}",
            key="metrics.port",
            hint="leave it out to serve no metrics; 0 picks a free port",
        )
    if not metrics.host:
        raise ConfigError("metrics.host must not be empty", key="metrics.host")
    return metrics


def _check_dsn(dsn: str) -> None:
    """A libpq connection string, or a configuration error naming the key. psycopg's
    message is not repeated: it quotes pieces of the string, which may hold a password."""
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ConfigError(
            "[source] dsn is not a libpq connection string",
            key="source.dsn",
            hint="write key=value pairs (host=... port=5432 dbname=... user=...) or a "
            "postgresql://user@host:port/dbname URI",
        ) from None


def _maintenance(raw: dict[str, Any]) -> MaintenanceConfig:
    for key in ("target_file_size", "max_data_files", "max_delete_files", "max_manifests"):
        if key in raw and raw[key] < 1:
            raise ConfigError(f"maintenance.{key} must be positive", key=f"maintenance.{key}")
    if raw.get("driver_compact_bytes", 0) < 0:
        raise ConfigError(
            "maintenance.driver_compact_bytes must be 0 (always a Spark job) or more",
            key="maintenance.driver_compact_bytes",
        )
    if raw.get("retain_snapshots", 1) < 1:
        raise ConfigError(
            "maintenance.retain_snapshots must be at least 1 (the current snapshot)",
            key="maintenance.retain_snapshots",
        )
    for key in ("max_delete_ratio", "file_delete_ratio"):
        if key in raw:
            raw[key] = float(raw[key])
            if not 0 < raw[key] <= 1:
                raise ConfigError(f"maintenance.{key} must be in (0, 1]", key=f"maintenance.{key}")
    for key in ("retain_seconds", "orphan_grace_seconds", "orphan_interval_seconds"):
        if key in raw:
            raw[key] = float(raw[key])
            if raw[key] < 0:
                raise ConfigError(f"maintenance.{key} must be 0 or more", key=f"maintenance.{key}")
    return MaintenanceConfig(**raw)
