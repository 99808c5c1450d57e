"""The PySpark worker daemon, with the apply's modules imported before it forks.

Spark forks a Python worker from this daemon for each task slot (set as
``spark.python.daemon.module`` in ``session.py``) and kills a worker that has been
idle for a minute. A fresh worker imports what its first task needs (the folds,
locate, pyarrow's compute and Parquet, networkx: 0.3-0.5 s, measured as the gap
between a batch's Spark job in the product and in-process). Imported here once, every
forked worker inherits them, so no batch pays them, whatever the pause before it.

One tiny task is run here too (``warm.py``): what pyarrow and numpy set up on first
use, every worker then inherits done.

Then they are frozen out of the garbage collector's sight (``gc.freeze``). PySpark's
daemon runs a full ``gc.collect()`` in the worker after every task, and a full
collection walks every tracked object: with the apply's modules imported that cost
about 20 ms a task (18 empty tasks on ``local[2]``: 0.95 s, 0.53 s frozen, 0.55 s with
nothing imported). Frozen objects are also left alone by the collector in the forked
workers, so their pages stay shared with the daemon.
"""

from __future__ import annotations

import contextlib
import gc

import networkx  # noqa: F401
import pyarrow.compute
import pyarrow.parquet  # noqa: F401
from pyspark import daemon

import sparkapply.apply.tasks  # noqa: F401
from sparkapply.apply.warm import warm_up

with contextlib.suppress(Exception):  # only a head start: a worker does without
    warm_up()
gc.collect()
gc.freeze()

if __name__ == "__main__":
    daemon.manager()
