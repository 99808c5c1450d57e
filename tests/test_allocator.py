"""Arrow's allocator takes no transparent huge pages in sparkapply's processes
(sparkapply/allocator.py): not in the driver, not in Spark's Python workers, unless
the user's environment asks for them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from sparkapply.allocator import ALLOW_THP

assert ALLOW_THP == "MIMALLOC_ALLOW_THP"  # the probe below names it

# Allocates 256 MiB through pyarrow, as a batch's buffers would be, and reports the
# process's anonymous huge pages (kB) with the variable as the process saw it;
# mimalloc itself, asked to be verbose, says on stderr which value it read.
PROBE = """
import json, os, sys
if sys.argv[1] == "sparkapply":
    import sparkapply  # noqa: F401
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

def huge_kb():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0

before = huge_kb()
arrays = [pc.add(pa.array(np.arange(4_000_000, dtype=np.int64)), 1) for _ in range(4)]
print(json.dumps({"grew_kb": huge_kb() - before, "env": os.environ.get('MIMALLOC_ALLOW_THP')}))
"""


class Probe(NamedTuple):
    grew_kb: int  # anonymous huge pages the allocation added
    env: str | None  # the variable as the process saw it
    read: str | None  # the allow_thp value mimalloc says it read


def _probe(first: str, **env: str) -> Probe:
    clean = {k: v for k, v in os.environ.items() if k != ALLOW_THP}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, first],
        env={**clean, "MIMALLOC_VERBOSE": "1", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    said = re.search(r"option 'allow_thp': (\d+)", done.stderr)
    return Probe(int(found["grew_kb"]), found["env"], said.group(1) if said else None)


def _thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise or never."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    text = path.read_text() if path.exists() else "[never]"
    return text.split("[", 1)[1].split("]", 1)[0]


def test_importing_sparkapply_turns_mimallocs_huge_pages_off() -> None:
    ours = _probe("sparkapply")
    assert (ours.env, ours.read) == ("0", "0")
    # With the kernel's huge pages on request only (this machine), none are taken.
    assert ours.grew_kb == 0 or _thp_mode() == "always"
    plain = _probe("pyarrow")  # pyarrow alone: mimalloc's default, huge pages asked for
    assert (plain.env, plain.read) == (None, "1")


def test_a_users_own_setting_is_kept() -> None:
    mine = _probe("sparkapply", **{ALLOW_THP: "1"})
    assert (mine.env, mine.read) == ("1", "1")


def test_spark_python_workers_inherit_the_setting(spark: object) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    rdd = spark.sparkContext.parallelize([0, 1], 2)
    seen = set(rdd.map(lambda _: os.environ.get(ALLOW_THP)).collect())
    assert seen == {"0"}
