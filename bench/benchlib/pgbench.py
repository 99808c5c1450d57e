"""pgbench, PostgreSQL's own TPC-B-like load, as a workload for the live benchmarks.

``pgbench -i`` on the publisher makes and fills its four tables (``pgbench_history``
has no key: insert-only); the native subscriber gets the same tables, empty, with
their keys (``pgbench -i -I dtp``), and copies the rows when it subscribes. The
binary is the bundled server's (its version), else an installed one.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from sparkapply.embedded import NPM_PREFIX, PROJECT_ROOT, EmbeddedPostgres

# Each table and the columns its checksum sums (with count(*)).
TABLES: dict[str, tuple[str, ...]] = {
    "pgbench_accounts": ("aid", "abalance"),
    "pgbench_branches": ("bid", "bbalance"),
    "pgbench_tellers": ("tid", "tbalance"),
    "pgbench_history": ("aid", "delta"),
}


def binary(pg: EmbeddedPostgres) -> Path:
    """The server's own pgbench, else Debian's PostgreSQL 15 or the npm builds'."""
    candidates = [pg.binary("pgbench"), Path("/usr/lib/postgresql/15/bin/pgbench")]
    for root in sorted((PROJECT_ROOT / NPM_PREFIX / "node_modules").glob("pg*/native/bin")):
        candidates.append(root / "pgbench")
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(f"no pgbench found (looked at {', '.join(map(str, candidates))})")


def run(pg: EmbeddedPostgres, *args: str, timeout: float | None = None) -> str:
    """``pgbench <args>`` against ``pg`` over loopback TCP; its output (stdout and
    stderr), or SystemExit with it when it fails."""
    cmd = [str(binary(pg)), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", *args]
    cmd.append("postgres")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
    return out


def init(pg: EmbeddedPostgres, scale: int, *, steps: str = "dtgvp") -> None:
    """``pgbench -i`` (``steps``: ``dtgvp`` makes and fills the tables; ``dtp`` only
    makes them, with their primary keys)."""
    run(pg, "-i", "-q", "-I", steps, "-s", str(scale))


def figures(output: str) -> dict[str, float]:
    """What a pgbench run reports: transactions processed, tps, average latency (ms)
    and, with ``-R``, the average lag behind its schedule (ms)."""
    out: dict[str, float] = {}
    patterns = {
        "transactions": r"number of transactions actually processed: (\d+)",
        "tps": r"tps = ([\d.]+)",
        "latency_ms": r"latency average = ([\d.]+) ms",
        "schedule_lag_ms": r"rate limit schedule lag: avg ([\d.]+)",
        "failed": r"number of failed transactions: (\d+)",
    }
    for key, pattern in patterns.items():
        m = re.search(pattern, output)
        if m is not None:
            out[key] = float(m.group(1))
    return out
