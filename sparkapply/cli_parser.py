"""The command line's grammar: every verb, its flags, and the exit codes ``--help`` shows.

One convention across verbs: ``--config`` (or ``SPARKAPPLY_CONFIG``, or
``./sparkapply.toml``), ``--json`` wherever a script reads the output, ``--table``
repeatable wherever a verb takes tables, ``--timeout`` in seconds wherever a verb waits,
and the global flags (``-v``) before or after the verb. A usage error exits 64
(sysexits' EX_USAGE), never 2, which means an operator must fix the setup.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import NoReturn

from sparkapply import __version__

USAGE = 64
"""A command line argparse refuses (sysexits.h EX_USAGE)."""
UNHEALTHY = 3
"""``status --health``: no run streams from the slot."""
CONFIG_ENV = "SPARKAPPLY_CONFIG"
DEFAULT_CONFIG = "sparkapply.toml"

EXIT_CODES = """exit codes:
  0    done (verify: every table matches; check: nothing failed)
  1    verify: a table differs; otherwise an unexpected error (a bug: please report it)
  2    an operator must fix something; the message says what and how
  3    status --health: no run streams from the slot (the message says why)
  64   the command line is wrong
  130  a second SIGTERM/Ctrl-C: stopped without finishing the batch (nothing that is
       not durable was acknowledged)"""

VERBS: dict[str, str] = {
    "run": "replicate until stopped (SIGTERM / Ctrl-C)",
    "check": "preflight: the publisher (wal_level, role, publication, identities, slot, "
    "capacity), the work_dir, the catalog, and a Spark task writing in the warehouse",
    "status": "show the run, the slot, each table's applied LSN and counts, pending prepared "
    "transactions and the spool (also while `run` runs)",
    "verify": "compare the mirror with the publisher at one exact LSN",
    "cut": "print the newest cut: an LSN and each table's Iceberg snapshot id holding "
    "exactly the transactions up to it (read them together for a consistent mirror)",
    "skip": "drop the one source transaction that finishes at --lsn (as ALTER SUBSCRIPTION "
    "... SKIP does); the running or next `run` skips it",
    "resync": "copy tables again from a fresh snapshot, replacing their Iceberg contents "
    "(with sparkapply stopped)",
    "maintain": "compact, merge manifests, expire snapshots (deleting their files) and sweep "
    "orphans now, whatever the thresholds",
    "demo": "start a bundled PostgreSQL with a sample workload and mirror it (embedded defaults)",
}

VERBOSE_HELP = (
    "debug logging, and Spark's own log on the console (otherwise in <work_dir>/logs/spark.log)"
)
JSON_HELP = "print JSON (for scripts)"


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on an exit code of their own."""

    def error(self, message: str) -> NoReturn:
        self.print_usage()
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


def parser() -> Parser:
    p = Parser(
        prog="sparkapply",
        description="Mirror a PostgreSQL publication into Apache Iceberg tables with Spark.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"sparkapply {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    _verb(sub, "run").add_argument(
        "--until-caught-up",
        action="store_true",
        help="exit 0 once everything committed before the start is applied and acknowledged",
    )
    _check(_verb(sub, "check"))
    _status(_verb(sub, "status"))
    _verify(_verb(sub, "verify"))
    _cut(_verb(sub, "cut"))
    _skip(_verb(sub, "skip"))
    _resync(_verb(sub, "resync"))
    _maintain(_verb(sub, "maintain"))
    _demo(_verb(sub, "demo", config_optional=True))
    return p


def config_path(given: str | None) -> str:
    """``--config``, else ``SPARKAPPLY_CONFIG``, else ``./sparkapply.toml`` if it exists."""
    if given:
        return given
    if os.environ.get(CONFIG_ENV):
        return os.environ[CONFIG_ENV]
    if Path(DEFAULT_CONFIG).is_file():
        return DEFAULT_CONFIG
    parser().error(f"no config: pass --config FILE, set {CONFIG_ENV}, or make ./{DEFAULT_CONFIG}")


def _verb(
    sub: argparse._SubParsersAction[Parser], name: str, *, config_optional: bool = False
) -> Parser:
    """One verb's parser, with ``--config`` and the global flags, which are taken after
    the verb too (``sparkapply demo -v`` as ``sparkapply -v demo``)."""
    verb: Parser = sub.add_parser(
        name,
        help=VERBS[name],
        description=VERBS[name],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verb.add_argument(
        "--config",
        help="TOML config file; the demo's own settings beneath it"
        if config_optional
        else f"TOML config file (default: ${CONFIG_ENV}, else ./{DEFAULT_CONFIG})",
    )
    verb.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
    )
    return verb


def _json(verb: Parser) -> None:
    verb.add_argument("--json", action="store_true", help=JSON_HELP)


def _tables(verb: Parser, what: str, *, required: bool = False) -> None:
    verb.add_argument(
        "--table",
        action="append",
        default=[],
        required=required,
        metavar="SCHEMA.TABLE",
        help=f"{what} (repeat for more)",
    )


def _check(check: Parser) -> None:
    _json(check)


def _status(status: Parser) -> None:
    _json(status)
    status.add_argument(
        "--health",
        action="store_true",
        help=f"exit 0 when a run streams from the slot, {UNHEALTHY} (saying why) when it does "
        "not: not running, retrying, stopped by an error (for a health check)",
    )


def _verify(verify: Parser) -> None:
    _tables(verify, "only this table (default: every published table)")
    _json(verify)
    verify.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the mirror to reach the point (default 300)",
    )
    verify.add_argument(
        "--max-rows", type=int, default=20, help="differing rows reported per table (default 20)"
    )


def _cut(cut: Parser) -> None:
    which = cut.add_mutually_exclusive_group()
    which.add_argument("--lsn", help="the newest cut at or before this LSN (X/Y)")
    which.add_argument(
        "--at-lsn",
        help="a cut at exactly this LSN (X/Y): asks the running mirror to make it and "
        "waits for it (a later run makes it if none is running)",
    )
    cut.add_argument(
        "--timeout", type=float, default=60.0, help="seconds --at-lsn waits (default 60)"
    )
    cut.add_argument(
        "--tag",
        metavar="NAME",
        help="also tag every table at that cut (an Iceberg tag: read it as VERSION AS OF "
        "'NAME'; kept by expiry until --untag)",
    )
    which.add_argument("--untag", metavar="NAME", help="remove the tag NAME from every table")
    _json(cut)


def _skip(skip: Parser) -> None:
    skip.add_argument(
        "--lsn",
        required=True,
        help="the transaction's commit LSN X/Y, as the apply error names it (for a prepared "
        "transaction its COMMIT PREPARED or PREPARE LSN)",
    )
    _json(skip)


def _resync(resync: Parser) -> None:
    _tables(resync, "the published table to copy again", required=True)
    _json(resync)


def _maintain(maintain: Parser) -> None:
    _tables(maintain, "only this table (default: every table sparkapply writes)")
    maintain.add_argument(
        "--dry-run", action="store_true", help="report what would be done; change nothing"
    )
    _json(maintain)


def _demo(demo: Parser) -> None:
    demo.add_argument(
        "--rows",
        type=int,
        default=1_000_000,
        help="rows in shop.orders before sparkapply starts (copied); the live bulk load "
        "adds a tenth of that",
    )
    demo.add_argument(
        "--work-dir",
        help="the demo's own folder (default .sparkapply-demo); it is emptied at start, "
        "so one the demo did not make is refused",
    )
