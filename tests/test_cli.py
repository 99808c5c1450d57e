"""The command line as one piece: its exit codes, the config's three sources, the
global flags after the verb, and the same --json / --table on every verb that takes
them. Pure: no server (a config error is found before anything connects)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkapply.cli_parser import USAGE, VERBS, parser

CONFIG = '[source]\ndsn = "host=127.0.0.1 port=1"\npublication = "p"\n'


def _cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPARKAPPLY_")}
    return subprocess.run(
        [sys.executable, "-m", "sparkapply", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _verbs() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _option(verb: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in verb._actions if flag in a.option_strings), None)


def test_usage_errors_have_an_exit_code_of_their_own(tmp_path: Path) -> None:
    for args in (("run",), ("status", "--bogus"), ("nosuchverb",), ()):
        proc = _cli(*args, cwd=tmp_path)
        assert proc.returncode == USAGE, (args, proc.stderr)
    assert (
        "no config: pass --config FILE, set SPARKAPPLY_CONFIG" in _cli("run", cwd=tmp_path).stderr
    )


def test_the_config_comes_from_the_flag_the_environment_or_the_folder(tmp_path: Path) -> None:
    # `skip --lsn 0/0` loads the config, then refuses the LSN: exit 2, no server needed.
    (tmp_path / "elsewhere.toml").write_text(CONFIG)
    by_env = _cli("skip", "--lsn", "0/0", cwd=tmp_path, env={"SPARKAPPLY_CONFIG": "elsewhere.toml"})
    assert by_env.returncode == 2 and "names no transaction" in by_env.stderr, by_env.stderr
    (tmp_path / "sparkapply.toml").write_text(CONFIG)
    by_folder = _cli("skip", "--lsn", "0/0", cwd=tmp_path)
    assert by_folder.returncode == 2 and "names no transaction" in by_folder.stderr
    by_flag = _cli("skip", "--lsn", "0/0", "--config", "missing.toml", cwd=tmp_path)
    assert by_flag.returncode == 2 and "config file not found: missing.toml" in by_flag.stderr


def test_every_verb_says_its_exit_codes_and_takes_the_global_flags() -> None:
    verbs = _verbs()
    assert set(verbs) == set(VERBS)
    for name, verb in verbs.items():
        text = verb.format_help()
        assert "exit codes:" in text and "64" in text and "130" in text, name
        assert _option(verb, "-v") is not None, name
        assert parser().parse_args([name, "-v", *_required(name)]).verbose is True


def _required(name: str) -> list[str]:
    return {"skip": ["--lsn", "0/1"], "resync": ["--table", "s.t"]}.get(name, [])


@pytest.mark.parametrize("verb", ["check", "status", "verify", "cut", "skip", "resync", "maintain"])
def test_json_wherever_a_script_reads_the_output(verb: str) -> None:
    option = _option(_verbs()[verb], "--json")
    assert option is not None and option.help == "print JSON (for scripts)"


def test_table_repeats_on_every_verb_that_takes_it() -> None:
    takers = {n: _option(v, "--table") for n, v in _verbs().items()}
    assert {n for n, o in takers.items() if o is not None} == {"verify", "resync", "maintain"}
    for name, option in takers.items():
        if option is not None:
            assert isinstance(option, argparse._AppendAction), name
    args = parser().parse_args(["maintain", "--table", "a.b", "--table", "c.d"])
    assert args.table == ["a.b", "c.d"]
