"""Arrow's allocator, set up before pyarrow loads: no transparent huge pages.

pyarrow allocates through its bundled mimalloc, which by default asks the kernel for
transparent huge pages on its memory (its ``allow_thp`` option) and gives freed memory
back to the kernel after a few milliseconds. A batch's buffers are freed when it ends,
so the next batch touches fresh memory again, and each first touch of a 2 MiB huge page
makes the kernel zero all of it, however little of it the batch uses. In the race's
pgbench drain (bench/README.md) that zeroing was 11% of sparkapply's CPU (``perf``:
``clear_page_erms`` under ``mi_page_free_list_extend``), on the one core the driver's
receiving and applying share; without huge pages the apply thread's CPU for 20,000
pgbench transactions went from 0.19-0.26 s to 0.15-0.19 s, of it the kernel's from
0.09-0.19 s to 0.05-0.08 s.

mimalloc reads ``MIMALLOC_ALLOW_THP`` when it first allocates, so :func:`configure` runs
when ``sparkapply`` is imported, before any of its modules imports pyarrow; Spark's
Python workers inherit the variable through the JVM, which the driver starts later. A
value the user set is kept. In a process that loaded pyarrow before sparkapply, the
setting reaches only the processes started after.
"""

from __future__ import annotations

import os

ALLOW_THP = "MIMALLOC_ALLOW_THP"


def configure() -> None:
    """No transparent huge pages for mimalloc, unless the environment says otherwise."""
    os.environ.setdefault(ALLOW_THP, "0")
