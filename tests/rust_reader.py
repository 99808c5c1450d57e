"""iceberg-rust as a reader, in a process of its own.

The tests read every table with iceberg-rust (pyiceberg-core's DataFusion table
provider). That read runs here, in one child process per test run, not in the test's
process, for two reasons found the hard way:

- iceberg-rust's scan can block forever on a table with position-delete files (a lost
  wake-up in its delete-file loader, rare and timing-dependent: seen on a 2-core
  machine, where the same table then read at once in a fresh process;
  risingwavelabs/risingwave#21848 fixed it in their fork). A blocked read cannot be
  cancelled from Python; a process can be killed.
- A read abandoned on a thread of the test's process stays inside DataFusion's
  ``wait_for_future``, which attaches to Python once a second to check for signals. At
  interpreter shutdown that attach panics in PyO3 ("The Python interpreter is not
  initialized") and aborts the whole run (exit 134) after every test has passed.

So a read that has not answered after :data:`RUST_READ_SECONDS` kills the child, starts
a new one and is tried once more (:mod:`tests.reader_process` runs the child).

Run as ``python -m tests.rust_reader`` (by :class:`RustReader`, never by hand).
"""

from __future__ import annotations

import atexit
import sys
from typing import Any

import pyarrow as pa
from pyiceberg.table import Table

from tests.reader_process import ReaderProcess, serve

RUST_READ_SECONDS = 60.0
"""How long one read may take before the child is taken for blocked (see the module):
the suite's reads take well under a second, a few on a loaded 2-core machine."""

START_SECONDS = 120.0
"""How long a new child may take to import its libraries and say it is ready."""


class RustReader(ReaderProcess):
    """One child process reading tables with iceberg-rust, started on first use."""

    def __init__(self, seconds: float = RUST_READ_SECONDS) -> None:
        super().__init__(
            [sys.executable, "-m", "tests.rust_reader"], "iceberg-rust", seconds, START_SECONDS
        )

    def read(self, table: Table, columns: list[str] | None = None) -> pa.Table:
        """The table's current snapshot (``columns`` of it, or all) as iceberg-rust reads
        it, for the same metadata file pyiceberg reads."""
        return self.ask(
            {
                "identifier": list(table.name()),
                "metadata_location": table.metadata_location,
                "properties": dict(table.io.properties),
                "columns": columns,
            }
        )


_shared: RustReader | None = None


def shared_reader() -> RustReader:
    """The test run's one reader process, stopped when the run ends."""
    global _shared
    if _shared is None:
        _shared = RustReader()
        atexit.register(_shared.close)
    return _shared


# THE CHILD


def main() -> None:
    import datafusion
    from pyiceberg_core.datafusion import IcebergDataFusionTable

    ctx = datafusion.SessionContext()

    def read(request: dict[str, Any]) -> pa.Table:
        provider = IcebergDataFusionTable(
            identifier=request["identifier"],
            metadata_location=request["metadata_location"],
            file_io_properties=request["properties"],
        )
        ctx.register_table("t", provider)
        try:
            frame = ctx.table("t")
            if request["columns"] is not None:
                frame = frame.select(*request["columns"])
            arrow: pa.Table = frame.to_arrow_table()
            return arrow
        finally:
            ctx.deregister_table("t")

    serve(read)


if __name__ == "__main__":
    main()
