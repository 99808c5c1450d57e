"""The command line: ``sparkapply run``, ``sparkapply demo`` (also ``python -m sparkapply``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from sparkapply.config import load_config
from sparkapply.errors import ErrorKind, SparkapplyError

log = logging.getLogger("sparkapply")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sparkapply",
        description="Mirror a PostgreSQL publication into Apache Iceberg tables with Spark.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="replicate until stopped (SIGTERM / Ctrl-C)")
    run.add_argument("--config", required=True, help="TOML config file")
    run.add_argument(
        "--until-caught-up",
        action="store_true",
        help="exit 0 once everything committed before the start is applied and acknowledged",
    )
    demo = sub.add_parser(
        "demo",
        help="start a bundled PostgreSQL with a sample workload and mirror it (embedded defaults)",
    )
    demo.add_argument("--config", default="configs/local.toml", help="TOML config file")
    demo.add_argument("--rows", type=int, default=200_000, help="rows in the bulk load")
    resync = sub.add_parser(
        "resync",
        help="copy one table again from a fresh snapshot, replacing its Iceberg contents "
        "(with sparkapply stopped)",
    )
    resync.add_argument("--config", required=True, help="TOML config file")
    resync.add_argument("--table", required=True, help="the published table, schema.table")
    _maintain_parser(sub)
    return p


def _maintain_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    maintain = sub.add_parser(
        "maintain",
        help="compact, merge manifests, expire snapshots (deleting their files) and sweep "
        "orphans now, whatever the thresholds",
    )
    maintain.add_argument("--config", required=True, help="TOML config file")
    maintain.add_argument("--table", help="only this table, schema.table (default: all)")
    maintain.add_argument(
        "--dry-run", action="store_true", help="report what would be done; change nothing"
    )


def _maintain(args: argparse.Namespace) -> int:
    from sparkapply.maintain.command import run_maintain

    run_maintain(load_config(args.config), table=args.table, dry_run=args.dry_run)
    return 0


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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("py4j", "pyiceberg", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "run":
            from sparkapply.subscriber import Subscriber

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
        if args.command == "demo":
            from sparkapply.demo import run_demo

            return run_demo(args.config, rows=args.rows)
        if args.command == "resync":
            from sparkapply.copy.driver import resync

            report = resync(load_config(args.config), args.table)
            log.info("resync of %s done: %s rows", args.table, f"{report.total_rows:,}")
            return 0
        if args.command == "maintain":
            return _maintain(args)
    except SparkapplyError as exc:
        log.error("%s", exc)
        return 2 if exc.kind is ErrorKind.OPERATOR else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
