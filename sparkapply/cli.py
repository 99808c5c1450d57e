"""The command line: ``sparkapply run|check|status|verify|cut|skip|resync|maintain|demo``
(also ``python -m sparkapply``). It parses the arguments (:mod:`sparkapply.cli_parser`,
which also says the exit codes), loads the config and calls the verb (``commands/``,
``verify/``, ``maintain/``, the subscriber for ``run``); an error's kind is the exit
code (2: an operator must act, 1: otherwise)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from sparkapply.cli_parser import UNHEALTHY, config_path, parser
from sparkapply.config import Config, load_config
from sparkapply.errors import ErrorKind, SparkapplyError
from sparkapply.storage import refused

log = logging.getLogger("sparkapply")


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


def _config(args: argparse.Namespace) -> Config:
    return load_config(config_path(args.config))


def _print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2, default=str))


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
        "check": _check,
    }
    try:
        if args.command != "demo":
            from sparkapply.apply.session import configure_spark_logging

            configure_spark_logging(_config(args).work_dir, verbose=args.verbose)
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

    sub = Subscriber(_config(args))
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

    status = gather(_config(args))
    print(to_json(status) if args.json else render_text(status))
    if args.health:
        why = status.health()
        if why is not None:
            log.error("unhealthy: %s", why)
            return UNHEALTHY
    return 0


def _skip(args: argparse.Namespace) -> int:
    from sparkapply.commands.skip import request_skip

    lsn = request_skip(_config(args), args.lsn)
    if args.json:
        _print_json({"skip": str(lsn), "recorded": True})
    return 0


def _demo(args: argparse.Namespace) -> int:
    from sparkapply.commands.demo import demo_config, run_demo

    # Only a config given by flag: the demo's tables must never land in the catalog of
    # the mirror that SPARKAPPLY_CONFIG or ./sparkapply.toml describes.
    config = demo_config(args.config, args.work_dir)
    return run_demo(config, rows=args.rows, verbose=args.verbose)


def _resync(args: argparse.Namespace) -> int:
    from sparkapply.commands.resync import resync

    config = _config(args)
    done = {}
    for table in args.table:
        report = resync(config, table)
        log.info("resync of %s done: %s rows", table, f"{report.total_rows:,}")
        done[table] = {"rows": report.total_rows, "seconds": round(report.seconds, 3)}
    if args.json:
        _print_json({"resynced": done})
    return 0


def _cut(args: argparse.Namespace) -> int:
    from sparkapply.commands.cut import run_cut, untag_cut

    config = _config(args)
    if args.untag is not None:
        return untag_cut(config, args.untag, tag=args.tag)
    return run_cut(
        config, args.lsn, args.at_lsn, timeout=args.timeout, tag=args.tag, as_json=args.json
    )


def _verify(args: argparse.Namespace) -> int:
    from sparkapply.verify.command import run_verify

    try:
        report = run_verify(
            _config(args),
            tables=args.table,
            timeout=args.timeout,
            max_rows=args.max_rows,
        )
    except SparkapplyError as exc:
        log.error("verify could not run: %s", exc)
        return 2
    print(report.as_json() if args.json else report.render())
    return 0 if report.match else 1


def _check(args: argparse.Namespace) -> int:
    from sparkapply.commands.check import render_text, run_checks, to_json

    found = run_checks(_config(args))
    print(to_json(found) if args.json else render_text(found))
    return 2 if any(f.failed for f in found) else 0


def _maintain(args: argparse.Namespace) -> int:
    from sparkapply.maintain.command import run_maintain

    config = _config(args)
    reports = []
    for table in args.table or [None]:
        reports += run_maintain(config, table=table, dry_run=args.dry_run)
    if args.json:
        _print_json({"tables": [dataclasses.asdict(r) for r in reports]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
