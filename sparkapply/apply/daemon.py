"""The PySpark worker daemon, with the apply's modules imported before it forks.

Spark forks a Python worker from this daemon for each task slot (set as
``spark.python.daemon.module`` in ``session.py``) and kills a worker that has been
idle for a minute. A fresh worker imports what its first task needs (the folds,
locate, pyarrow's compute and Parquet, networkx: 0.3-0.5 s, measured as the gap
between a batch's Spark job in the product and in-process). Imported here once, every
forked worker inherits them, so no batch pays them, whatever the pause before it.
"""

from __future__ import annotations

import networkx  # noqa: F401
import pyarrow.compute
import pyarrow.parquet  # noqa: F401
from pyspark import daemon

import sparkapply.apply.tasks  # noqa: F401

if __name__ == "__main__":
    daemon.manager()
