"""The command line: ``sparkapply run|status|skip|resync|maintain|cut|verify|demo`` (also
``python -m sparkapply``). It parses the arguments, loads the config and calls the verb
(``commands/``, ``verify/``, ``maintain/``, the subscriber for ``run``); an error's kind
is the exit code (2: an operator must act, 1: otherwise)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from sparkapply import __version__
from sparkapply.config import load_config
from sparkapply.errors import ErrorKind, SparkapplyError
from sparkapply.storage import refused

log = logging.getLogger("sparkapply")


# What ``--help`` says of each verb.
VERBS: dict[str, str] = {
    "run": "replicate until stopped (SIGTERM / Ctrl-C)",
    "demo": "start a bundled PostgreSQL with a sample workload and mirror it (embedded defaults)",
    "resync": "copy one table again from a fresh snapshot, replacing its Iceberg contents "
    "(with sparkapply stopped)",
    "status": "show the slot, each table's applied LSN and counts, pending prepared "
    "transactions and the spool (also while `run` runs)",
    "skip": "drop the one source transaction that finishes at --lsn (as ALTER SUBSCRIPTION "
    "... SKIP does); the running or next `run` skips it",
    "maintain": "compact, merge manifests, expire snapshots (deleting their files) and sweep "
    "orphans now, whatever the thresholds",
    "cut": "print the newest cut: an LSN and each table's Iceberg snapshot id holding "
    "exactly the transactions up to it (read them together for a consistent mirror)",
    "verify": "compare the mirror with the publisher at one exact LSN; exit 0 when every "
    "table matches, 1 when one differs, 2 when verify could not run",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sparkapply",
        description="Mirror a PostgreSQL publication into Apache Iceberg tables with Spark.",
    )
    p.add_argument("--version", action="version", version=f"sparkapply {__version__}")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging, and Spark's own log on the console "
        "(otherwise in <work_dir>/logs/spark.log)",
    )
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    _verb(sub, "run").add_argument(
        "--until-caught-up",
        action="store_true",
        help="exit 0 once everything committed before the start is applied and acknowledged",
    )
    _verb(sub, "demo", config_default="configs/local.toml").add_argument(
        "--rows",
        type=int,
        default=1_000_000,
        help="rows in shop.orders before sparkapply starts (copied); the live bulk load "
        "adds a tenth of that",
    )
    _verb(sub, "resync").add_argument(
        "--table", required=True, help="the published table, schema.table"
    )
    _verb(sub, "status").add_argument(
        "--json", action="store_true", help="print JSON (for scripts)"
    )
    _verb(sub, "skip").add_argument(
        "--lsn",
        required=True,
        help="the transaction's commit LSN X/Y, as the apply error names it (for a prepared "
        "transaction its COMMIT PREPARED or PREPARE LSN)",
    )
    maintain = _verb(sub, "maintain")
    maintain.add_argument("--table", help="only this table, schema.table (default: all)")
    maintain.add_argument(
        "--dry-run", action="store_true", help="report what would be done; change nothing"
    )
    _cut_parser(_verb(sub, "cut"))
    _verify_parser(_verb(sub, "verify"))
    return p


def _verb(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    config_default: str | None = None,
) -> argparse.ArgumentParser:
    """The parser of one verb, with its ``--config`` (required unless it has a default)."""
    verb = sub.add_parser(name, help=VERBS[name])
    if config_default is None:
        verb.add_argument("--config", required=True, help="TOML config file")
    else:
        verb.add_argument("--config", default=config_default, help="TOML config file")
    return verb


def _verify_parser(verify: argparse.ArgumentParser) -> None:
    verify.add_argument(
        "--table", action="append", default=[], help="only this table, schema.table (repeat)"
    )
    verify.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    verify.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the mirror to reach the point (default 300)",
    )
    verify.add_argument(
        "--max-rows", type=int, default=20, help="differing rows reported per table (default 20)"
    )


def _cut_parser(cut: argparse.ArgumentParser) -> None:
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
    cut.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def _install_signals(stop: object) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        if getattr(handler, "fired", False):
            log.error("second signal: exiting without finishing the batch")
            raise SystemExit(130)
        handler.fired = True  # type: ignore[attr-defined]
        log.warning("stopping after the current batch (signal %d)", signum)
        stop()  # type: ignore[operator]

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _route_spark_output(config_path: str, *, verbose: bool) -> None:
    from sparkapply.apply.session import configure_spark_logging

    configure_spark_logging(load_config(config_path).work_dir, verbose=verbose)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("py4j", "pyiceberg", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    commands = {
        "run": _run,
        "status": _status,
        "skip": _skip,
        "demo": _demo,
        "resync": _resync,
        "maintain": _maintain,
        "cut": _cut,
        "verify": _verify,
    }
    try:
        if getattr(args, "config", None):
            _route_spark_output(args.config, verbose=args.verbose)
        return commands[args.command](args)
    except SparkapplyError as exc:
        log.error("%s", exc)
        return 2 if exc.kind is ErrorKind.OPERATOR else 1
    except OSError as exc:
        # pyiceberg's own reads and writes on the object store (metadata, manifests).
        if (error := refused(exc)) is None:
            raise
        log.error("%s", error)
        return 2


def _run(args: argparse.Namespace) -> int:
    from sparkapply.run.subscriber import Subscriber

    config = load_config(args.config)
    sub = Subscriber(config)
    _install_signals(sub.stop)
    summary = sub.run(until_caught_up=args.until_caught_up)
    log.info(
        "stopped: %d batches, %d transactions, flushed to %s",
        summary.batches,
        summary.transactions,
        summary.flushed,
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    from sparkapply.commands.status import gather, render_text, to_json

    status = gather(load_config(args.config))
    print(to_json(status) if args.json else render_text(status))
    return 0


def _skip(args: argparse.Namespace) -> int:
    from sparkapply.commands.skip import request_skip

    request_skip(load_config(args.config), args.lsn)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from sparkapply.commands.demo import run_demo

    return run_demo(args.config, rows=args.rows)


def _resync(args: argparse.Namespace) -> int:
    from sparkapply.commands.resync import resync

    report = resync(load_config(args.config), args.table)
    log.info("resync of %s done: %s rows", args.table, f"{report.total_rows:,}")
    return 0


def _cut(args: argparse.Namespace) -> int:
    from sparkapply.commands.cut import run_cut, untag_cut

    config = load_config(args.config)
    if args.untag is not None:
        return untag_cut(config, args.untag, tag=args.tag)
    return run_cut(
        config, args.lsn, args.at_lsn, timeout=args.timeout, tag=args.tag, as_json=args.json
    )


def _verify(args: argparse.Namespace) -> int:
    from sparkapply.verify.command import run_verify

    try:
        report = run_verify(
            load_config(args.config),
            tables=args.table,
            timeout=args.timeout,
            max_rows=args.max_rows,
        )
    except SparkapplyError as exc:
        log.error("verify could not run: %s", exc)
        return 2
    print(report.as_json() if args.json else report.render())
    return 0 if report.match else 1


def _maintain(args: argparse.Namespace) -> int:
    from sparkapply.maintain.command import run_maintain

    run_maintain(load_config(args.config), table=args.table, dry_run=args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
