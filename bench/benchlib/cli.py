"""What every benchmark script's command line shares: the parser titled by the
script's docstring, the output options and the JSON result they choose, and the exit
on SIGTERM that lets the ``finally`` blocks end the processes a benchmark started."""

from __future__ import annotations

import argparse
import re
import signal
from collections.abc import Callable, Sequence
from types import FrameType

from benchlib.report import Output, add_output_options


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first line of the script's docstring."""
    return argparse.ArgumentParser(description=(doc or "").splitlines()[0])


def add_size_options(parser: argparse.ArgumentParser, *, rows: int, repeat: int) -> None:
    """``--rows`` (the size of the load) and ``--repeat`` (the best of how many runs)."""
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--repeat", type=int, default=repeat)


def parse_bench_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    results: str | None,
    name: str | Callable[[argparse.Namespace], str] | None = None,
) -> tuple[argparse.Namespace, Output]:
    """Add ``--out`` and ``--allow-dirty`` (after the script's own options), parse, and
    check where the JSON goes: by default into bench/results/ as ``results`` says, each
    ``<option>`` in it replaced by the option's value; with ``results`` None only where
    ``--out`` says, as ``name``. ``name`` (or ``name(args)``) overrides the file name.
    A ``--repeat`` below 1 counts as 1."""
    add_output_options(parser, results)
    args = parser.parse_args(argv)
    if "repeat" in args:
        args.repeat = max(1, args.repeat)
    if callable(name):
        out_name = name(args)
    elif name is not None:
        out_name = name
    else:
        assert results is not None, "a JSON name, or the default under bench/results/"
        out_name = re.sub(r"<(\w+)>", lambda m: str(getattr(args, m.group(1))), results)
    output = Output.from_args(args.out, out_name, args.allow_dirty, by_default=results is not None)
    return args, output


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so that the ``finally`` blocks run."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
