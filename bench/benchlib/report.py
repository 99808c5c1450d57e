"""What a benchmark prints and writes: progress lines, tables, and its JSON result
stamped with the code measured.

Results in ``bench/results/`` are measured data. A benchmark refuses to write there
from a tree with uncommitted changes under ``sparkapply/`` or ``bench/`` (the figures
would belong to no commit) unless told ``--allow-dirty``, which the JSON then records.
The check runs before anything is measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
WATCHED = ("sparkapply", "bench")  # what the figures depend on


def log(text: str) -> None:
    """Progress, on stderr: the result table alone goes to stdout."""
    print(f"# {text}", file=sys.stderr, flush=True)


def log_progress(*quiet: str) -> None:
    """Log INFO to stderr as ``# name: message`` lines (kept apart from the results on
    stdout), with the ``quiet`` loggers at WARNING."""
    logging.basicConfig(level=logging.INFO, format="# %(name)s: %(message)s", stream=sys.stderr)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)


def print_table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[object]]) -> None:
    """Rows under a header; ``columns`` are (title, format spec), e.g. ("seconds", ">8.2f"):
    the title takes the spec's alignment and width."""
    heads = []
    for title, spec in columns:
        m = re.match(r"([<>^]?)(\d*)", spec)
        align, width = (m.group(1) or ">", m.group(2)) if m else (">", "")
        heads.append(f"{title:{align}{width}}")
    print("".join(heads).rstrip())
    for row in rows:
        print("".join(f"{value:{spec}}" for value, (_, spec) in zip(row, columns, strict=True)))


def columns(spec: str) -> list[tuple[str, str]]:
    """:func:`print_table`'s columns written on one line, ``"title:spec|title:spec"``;
    a title keeps its spaces and may be empty."""
    return [(title, fmt) for title, _, fmt in (c.rpartition(":") for c in spec.split("|"))]


def uncommitted(repo: Path = REPO) -> list[str]:
    """Files under WATCHED that differ from HEAD (untracked ones included), except the
    results themselves."""
    proc = subprocess.run(
        ["git", "status", "--porcelain", "--", *WATCHED, ":(exclude)bench/results"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(line[3:] for line in proc.stdout.splitlines() if line.strip())


def code_version(repo: Path = REPO) -> dict[str, Any]:
    """The commit measured and the files that differed from it."""
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
    )
    return {"commit": proc.stdout.strip(), "uncommitted": uncommitted(repo)}


def add_output_options(parser: argparse.ArgumentParser, default: str | None) -> None:
    """``--out`` (a JSON file, or a directory for the default name) and ``--allow-dirty``."""
    where = f"default bench/results/{default}" if default else "default: none"
    parser.add_argument("--out", type=Path, help=f"JSON file or directory ({where})")
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write bench/results/ from uncommitted changes (recorded in the JSON)",
    )


@dataclass(frozen=True, slots=True)
class Output:
    """Where the JSON goes (None: nowhere) and the code it describes, checked at start."""

    path: Path | None
    code: dict[str, Any]

    @classmethod
    def from_args(
        cls,
        out: Path | None,
        name: str,
        allow_dirty: bool,
        *,
        by_default: bool = True,
        repo: Path = REPO,
    ) -> Output:
        """``out`` (a file, or a directory to put ``name`` in); without it
        ``bench/results/<name>`` if ``by_default``, else no JSON."""
        if out is None:
            path = repo / "bench" / "results" / name if by_default else None
        else:
            path = out / name if out.is_dir() else out
        code = code_version(repo) | {"allow_dirty": allow_dirty}
        results = (repo / "bench" / "results").resolve()
        inside = path is not None and path.resolve().is_relative_to(results)
        if inside and code["uncommitted"] and not allow_dirty:
            raise SystemExit(
                f"refusing to write {path}: uncommitted changes under "
                f"{' and '.join(WATCHED)}: {', '.join(code['uncommitted'])}"
                " (commit them, give --out elsewhere, or --allow-dirty)"
            )
        return cls(path, code)

    def write(self, report: dict[str, Any]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {**report, "code": self.code}
        self.path.write_text(json.dumps(body, indent=1, default=str) + "\n")
        log(f"wrote {self.path}")


def machine(spark_master: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    if spark_master is not None:
        out["spark_master"] = spark_master
    return out
