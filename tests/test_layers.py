"""The package layers: an import never reaches a package later in the data flow.

The flow is ``pgoutput → changes → plan → apply → sink``; ``source``, ``convert``
and ``state`` sit below the flow (they may read the wire format, nothing after it);
the small shared modules (errors, lsn, config, ...) sit below everything; the
commands (``run``: the loop and the driver's side of a batch; copy, verify, maintain,
status, ...) sit above. A package may import its own layer and the layers below it.
Read from the source with ``ast`` (imports under ``TYPE_CHECKING`` count: they are
dependencies too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import sparkapply

ROOT = Path(sparkapply.__file__).parent

SHARED = 0
LAYERS: dict[str, int] = {
    **dict.fromkeys(
        (
            "__init__",
            "allocator",
            "errors",
            "lsn",
            "failpoints",
            "location",
            "storage",
            "config",
            "collector",
            "frozen",
        ),
        SHARED,
    ),
    "embedded": SHARED,  # the bundled PostgreSQL: uses only the errors
    "pgoutput": 1,
    **dict.fromkeys(("source", "convert", "state", "datafiles"), 2),
    "changes": 3,
    "plan": 4,
    **dict.fromkeys(("apply", "staging"), 5),
    "sink": 6,
    **dict.fromkeys(
        (
            "__main__",
            "cli",
            "cli_parser",
            "run",
            "metrics",
            "commands",
            "read",
            "copy",
            "maintain",
            "verify",
        ),
        7,
    ),
}

# Climbs still in the code, each with where it stands; the test fails when one goes
# (take it out of this list) or a new one appears.
KNOWN_CLIMBS: set[tuple[str, str]] = set()


def _imports(path: Path) -> set[str]:
    """The sparkapply packages or top-level modules ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "sparkapply":
                names = [f"sparkapply.{a.name}" for a in node.names]
            else:
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "sparkapply" and len(parts) > 1:
                found.add(parts[1])
    return found


def _layer_of(path: Path) -> str:
    return path.relative_to(ROOT).with_suffix("").parts[0]


def _climbs() -> dict[tuple[str, str], list[str]]:
    climbs: dict[tuple[str, str], list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        source = _layer_of(path)
        for target in _imports(path) - {source, "__version__"}:
            if LAYERS[target] > LAYERS[source]:
                climbs.setdefault((source, target), []).append(str(path.relative_to(ROOT)))
    return climbs


def test_every_package_has_a_layer() -> None:
    names = {_layer_of(p) for p in ROOT.rglob("*.py")}
    assert names - set(LAYERS) == set(), "give the new package or module a layer here"
    assert set(LAYERS) - names == set(), "a package named here is gone"


def test_no_import_climbs_the_data_flow() -> None:
    climbs = _climbs()
    new = {pair: files for pair, files in climbs.items() if pair not in KNOWN_CLIMBS}
    assert new == {}, f"imports that reach a later layer: {new}"
    gone = KNOWN_CLIMBS - set(climbs)
    assert gone == set(), f"no longer climbs, take out of KNOWN_CLIMBS: {gone}"


def test_the_reader_sees_imports_that_climb(tmp_path: Path) -> None:
    """The check itself: a climbing import, also under TYPE_CHECKING, is found."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "from sparkapply import lsn\n"
        "import sparkapply.pgoutput.messages\n"
        "if TYPE_CHECKING:\n"
        "    from sparkapply.apply.tasks import TableTask\n"
    )
    assert _imports(sample) == {"lsn", "pgoutput", "apply"}
