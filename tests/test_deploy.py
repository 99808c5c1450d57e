"""The service pack in deploy/: what can be checked here is checked. The unit file is
verified by systemd itself; the entrypoint runs; every metric the alert rules name is
one the run exports. (The Dockerfile is not built: this machine has no container
daemon; it installs what pyproject.toml says and starts the entrypoint tested here.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sparkapply import __version__
from sparkapply.config import MetricsConfig, SourceConfig
from sparkapply.metrics import Metrics

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SPARKAPPLY = str(Path(sys.executable).with_name("sparkapply"))


def test_the_unit_file_is_valid_for_systemd(tmp_path: Path) -> None:
    systemd_analyze = shutil.which("systemd-analyze")
    assert systemd_analyze is not None, "systemd-analyze (Debian's systemd) is needed"
    unit = (DEPLOY / "sparkapply.service").read_text()
    assert "ExecStartPre=/opt/sparkapply/.venv/bin/sparkapply check" in unit
    assert "RestartPreventExitStatus=2 64" in unit  # an operator's fix, not a retry
    # Here, with this machine's interpreter and user: systemd checks every key.
    local = (
        unit.replace("/opt/sparkapply/.venv/bin/sparkapply", SPARKAPPLY)
        .replace("=sparkapply\n", "=root\n")
        .replace("WorkingDirectory=/var/lib/sparkapply", f"WorkingDirectory={tmp_path}")
    )
    path = tmp_path / "sparkapply.service"
    path.write_text(local)
    proc = subprocess.run(
        [systemd_analyze, "verify", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stderr


def _entrypoint(*args: str, config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKAPPLY_")}
    env.update(SPARKAPPLY_BIN=SPARKAPPLY, SPARKAPPLY_CONFIG=str(config))
    return subprocess.run(
        ["sh", str(DEPLOY / "entrypoint.sh"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_entrypoint_runs_a_verb_and_checks_before_it_runs(tmp_path: Path) -> None:
    version = _entrypoint("--version", config=tmp_path / "none.toml", tmp_path=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"sparkapply {__version__}"
    missing = _entrypoint("status", config=tmp_path / "none.toml", tmp_path=tmp_path)
    assert missing.returncode == 2 and "config file not found" in missing.stderr
    # No arguments: check first, and a failed check keeps `run` from starting.
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'work_dir = "{tmp_path / "work"}"\n'
        '[source]\ndsn = "host=127.0.0.1 port=1 connect_timeout=2"\npublication = "p"\n'
    )
    default = _entrypoint(config=cfg, tmp_path=tmp_path)
    assert default.returncode == 2, default.stderr
    assert "FAIL  publisher" in default.stdout
    assert "starting Spark" not in default.stderr  # run never began


def test_every_metric_the_alerts_name_is_exported(tmp_path: Path) -> None:
    metrics = Metrics(MetricsConfig(), tmp_path, SourceConfig("host=127.0.0.1 port=1", ("p",)))
    exported = {sample.name for family in metrics.registry.collect() for sample in family.samples}
    rules = (DEPLOY / "alerts.yml").read_text()
    named = set(re.findall(r"\bsparkapply_[a-z_]+", rules))
    assert len(named) >= 8
    assert named <= exported, named - exported
    assert rules.count("- alert:") == rules.count("expr:") == rules.count("severity:")
