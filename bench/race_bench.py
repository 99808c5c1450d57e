"""The race: a live ``sparkapply run`` against PostgreSQL's native subscriber, same backlog.

    python bench/race_bench.py [--workload bulk|update|scatter|mixed|pgbench]
                               [--rows N] [--updates 20000] [--transactions 20000]
                               [--clients 4] [--scale 1] [--repeat 3]
                               [--first alternate|native|sparkapply] [--no-maintenance]
                               [--no-freeze-walsender] [--native-synchronous-commit on|off]
                               [--log-dir DIR] [--out PATH] [--allow-dirty]

The product as users run it: ``sparkapply run --config F`` in a process of its own
with the default config (``[spark] master = "local[2]"``, the work dir, the slot and a
SQLite catalog set; maintenance on), warmed by one small batch, frozen (SIGSTOP of its
process tree and of its walsender) while the load is written, then released and timed
until its slot's ``confirmed_flush_lsn`` on the publisher reaches the end of the load.
The native subscription (``streaming = parallel``), warmed by the same transaction,
is disabled during the load, then enabled and timed the same way. Neither side
fsyncs (``fsync = off`` on both servers; the subscription commits with
``synchronous_commit = on``, i.e. its WAL is written to the OS at each commit, as
sparkapply writes its files). Each round has fresh consumers; the two drain one at a
time, in an order that alternates between rounds. Both copies are verified.

Workloads (``benchlib.workloads``, as in ``apply_bench.py``): ``bulk`` (``--rows``
inserted in one transaction), ``update`` (every row of a ``--rows`` table updated in
one transaction), ``scatter`` (``--updates`` one-row update transactions on a
``--rows`` table), ``mixed`` (``--rows`` inserts in transactions of 1,000, with updates
and deletes), and ``pgbench`` (``pgbench -i -s --scale`` on the publisher, then
``pgbench -c --clients -t ...`` for ``--transactions`` in all).

Reports the best of ``--repeat`` for each side and the ratio native seconds /
sparkapply seconds (above 1: sparkapply is faster); writes
``bench/results/race_<workload>.json`` with every round, sparkapply's batches as its
log reports them, and the settings. See bench/README.md.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from benchlib.cli import bench_parser, exit_on_sigterm, parse_bench_args
from benchlib.consumers import Results
from benchlib.live import SPARK_MASTER, live_settings
from benchlib.race import (
    OrdersWorkload,
    PgbenchWorkload,
    RaceOptions,
    RaceWorkload,
    Round,
    order_of,
)
from benchlib.report import Output, columns, log, machine, print_table
from benchlib.servers import LIVE_PUBLISHER, LIVE_SUBSCRIBER, scratch, server
from benchlib.workloads import Backlog

WORKLOADS = ("bulk", "update", "scatter", "mixed", "pgbench")
DEFAULT_ROWS = {"bulk": 1_000_000, "update": 1_000_000, "scatter": 1_000_000, "mixed": 200_000}
NATIVE = "native (streaming=parallel)"
SPARKAPPLY = f"sparkapply run ({SPARK_MASTER})"


def make_workload(args: argparse.Namespace) -> RaceWorkload:
    if args.workload == "pgbench":
        return PgbenchWorkload(args.scale, args.transactions, args.clients)
    rows = args.rows or DEFAULT_ROWS[args.workload]
    return OrdersWorkload(args.workload, rows, args.updates)


def print_report(
    workload: RaceWorkload, backlog: Backlog, native: Results, sa: Results, repeat: int
) -> float:
    print(f"race, workload {workload.name}: {workload.describe(backlog)}")
    print(
        f"{backlog.changes:,} row changes, {backlog.wal_bytes / 1e6:.1f} MB of WAL; best of"
        f" {repeat}; timed to the slot's confirmed_flush_lsn; one consumer at a time"
    )
    table = columns("consumer:<30|seconds:>8.2f|CPU s:>7.1f|pub CPU:>8.1f|   all runs (s):<24")
    rows = []
    for res in (native, sa):
        b = res.best
        runs = "   " + " ".join(f"{r.seconds:.2f}" for r in res.runs)
        rows.append((res.name, b.seconds, b.cpu["consumer"], b.cpu["publisher"], runs))
    print_table(table, rows)
    ratio = native.best.seconds / sa.best.seconds
    print(f"ratio native/sparkapply: {ratio:.2f} (above 1: sparkapply is faster)")
    timeline = sa.best.detail.get("log", {})
    for b in timeline.get("batches", []):
        staged = f", {b['staged_rows']:,} staged" if b["staged_rows"] else ""
        print(
            f"  sparkapply batch acknowledged at {b['t']:.2f}s: {b['transactions']:,}"
            f" transactions, {b['changes']:,} changes{staged}, {b['seconds']:.2f}s on the"
            " apply thread"
        )
    for line in timeline.get("other", []):
        print(f"  sparkapply log at {line['t']:.2f}s: {line['message'][:110]}")
    if "target_seen_at" in timeline:
        print(f"  target confirmed at {timeline['target_seen_at']:.2f}s")
    if timeline.get("split"):
        print(
            "  sparkapply's best run from its log, s: "
            + ", ".join(f"{k} {v:.2f}" for k, v in timeline["split"].items())
        )
    return ratio


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Output]:
    parser = bench_parser(__doc__)
    parser.add_argument("--workload", choices=WORKLOADS, default="bulk")
    parser.add_argument("--rows", type=int, help="default 1,000,000 (mixed: 200,000)")
    parser.add_argument("--updates", type=int, default=20_000, help="scatter: transactions")
    parser.add_argument("--transactions", type=int, default=20_000, help="pgbench, in all")
    parser.add_argument("--clients", type=int, default=4, help="pgbench -c")
    parser.add_argument("--scale", type=int, default=1, help="pgbench -i -s")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--first", choices=("alternate", "native", "sparkapply"), default="alternate"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="per drain")
    parser.add_argument(
        "--no-maintenance", action="store_true", help="[maintenance] enabled = false"
    )
    parser.add_argument(
        "--no-cuts",
        action="store_true",
        help='[sink] atomic_commit = false, cuts_table = "": tables commit one by one and '
        "no cut is recorded (the commit before cuts, to measure their cost)",
    )
    parser.add_argument(
        "--no-freeze-walsender",
        action="store_true",
        help="freeze sparkapply alone: its walsender decodes ahead into the socket",
    )
    parser.add_argument("--native-synchronous-commit", choices=("on", "off"), default="on")
    parser.add_argument("--log-dir", type=Path, help="keep each round's sparkapply log here")
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="sample sparkapply's driver with py-spy through each drain (a profile, not a"
        " figure: sampling slows it)",
    )
    return parse_bench_args(parser, argv, "race_<workload>.json")


def main(argv: list[str] | None = None) -> int:
    args, output = parse_args(argv)
    repeat = args.repeat
    logging.basicConfig(level=logging.WARNING)
    workload = make_workload(args)
    options = RaceOptions(
        maintenance=not args.no_maintenance,
        cuts=not args.no_cuts,
        freeze_walsender=not args.no_freeze_walsender,
        native_synchronous_commit=args.native_synchronous_commit,
        timeout=args.timeout,
        py_spy=args.py_spy,
    )
    exit_on_sigterm()
    native, sa = Results(NATIVE), Results(SPARKAPPLY)
    rounds: list[dict[str, Any]] = []
    backlog: Backlog | None = None
    with (
        scratch("sparkapply-race-") as tmp,
        server(tmp / "pub", LIVE_PUBLISHER) as pub,
        server(tmp / "sub", LIVE_SUBSCRIBER) as sub,
    ):
        workload.setup(pub, sub)
        for i in range(repeat):
            rnd = Round(i, pub, sub, tmp, workload, options)
            try:
                backlog, record = run_round(rnd, args.first, native, sa)
                rounds.append(record)
            finally:
                if args.log_dir is not None:
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    dest = args.log_dir / f"race_{args.workload}_round{i}.log"
                    if rnd.sparkapply.log_path.exists():
                        shutil.copyfile(rnd.sparkapply.log_path, dest)
                rnd.close()

    assert backlog is not None
    ratio = print_report(workload, backlog, native, sa, repeat)
    report: dict[str, Any] = {
        "benchmark": "race_bench",
        "workload": args.workload,
        "params": {
            k: getattr(args, k)
            for k in ("rows", "updates", "transactions", "clients", "scale", "first")
        }
        | {"rows": getattr(workload, "rows", None)},
        "repeat": repeat,
        "machine": machine(SPARK_MASTER),
        "settings": {
            **live_settings(
                options.native_synchronous_commit,
                {"copy_data": True},
                maintenance=options.maintenance,
                cuts=options.cuts,
            ),
            "freeze_walsender": options.freeze_walsender,
        },
        "rounds": rounds,
        "consumers": {
            NATIVE: native.summary(backlog.changes),
            SPARKAPPLY: sa.summary(backlog.changes),
        },
        "ratio_native_over_sparkapply": round(ratio, 3),
    }
    if isinstance(workload, PgbenchWorkload):
        report["pgbench_output_last_round"] = workload.output.strip().splitlines()[-12:]
    output.write(report)
    return 0


def run_round(
    rnd: Round, first: str, native: Results, sa: Results
) -> tuple[Backlog, dict[str, Any]]:
    """One round: fresh consumers, the load, each drain (added to ``native`` and
    ``sa``), both copies verified; the backlog and the round's record."""
    i = rnd.index
    rnd.prepare()
    backlog = rnd.load()
    log(
        f"round {i}: backlog of {backlog.changes:,} changes in"
        f" {backlog.transactions:,} transactions, {backlog.wal_bytes / 1e6:.1f} MB"
        f" of WAL, written in {backlog.seconds:.1f}s (target {backlog.last_commit})"
    )
    order = order_of(first, i)
    drains: dict[str, Any] = {}
    for k, who in enumerate(order):
        if who == "sparkapply":
            run = rnd.drain_sparkapply(backlog, pause_after=k == 0)
            sa.runs.append(run)
        else:
            run = rnd.drain_native(backlog)
            native.runs.append(run)
        drains[who] = {
            "seconds": round(run.seconds, 3),
            "load_before": round(run.load_before, 2),
            "cpu": run.cpu,
            **run.detail,
        }
        log(f"round {i}: {who} {run.seconds:.2f}s (load {run.load_before:.2f})")
    verified = rnd.verify()
    record = {
        "round": i,
        "order": list(order),
        "backlog": backlog.as_json(),
        "setup_seconds": {k: round(v, 2) for k, v in rnd.setup_seconds.items()},
        "drains": drains,
        "verified": verified,
    }
    return backlog, record


if __name__ == "__main__":
    sys.exit(main())
