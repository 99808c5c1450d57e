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

So a read that has not answered after :data:`RUST_READ_SECONDS` (the child's start, its
imports, is not counted) kills the child, starts a new one and is tried once more. The
child reads requests on stdin and answers on the stdout it was started with; anything
else it prints goes to stderr.

Run as ``python -m tests.rust_reader`` (by :class:`RustReader`, never by hand).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
from pyiceberg.table import Table

RUST_READ_SECONDS = 60.0
"""How long one read may take before the child is taken for blocked (see the module):
the suite's reads take well under a second, a few on a loaded 2-core machine."""

START_SECONDS = 120.0
"""How long a new child may take to import its libraries and say it is ready."""

_LENGTH = struct.Struct("<Q")
_READY, _OK, _FAILED = b"R", b"+", b"-"
_ROOT = Path(__file__).resolve().parent.parent


class RustReadTimeout(TimeoutError):
    """The child gave no answer in time."""


class RustReader:
    """One child process reading tables with iceberg-rust, started on first use."""

    def __init__(self, seconds: float = RUST_READ_SECONDS) -> None:
        self.seconds = seconds
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def read(self, table: Table, columns: list[str] | None = None) -> pa.Table:
        """The table's current snapshot (``columns`` of it, or all) as iceberg-rust reads
        it, for the same metadata file pyiceberg reads."""
        request: dict[str, Any] = {
            "identifier": list(table.name()),
            "metadata_location": table.metadata_location,
            "properties": dict(table.io.properties),
            "columns": columns,
        }
        with self._lock:
            try:
                return self._ask(request)
            except RustReadTimeout:
                self._stop()  # blocked: once more, in a new process
            try:
                return self._ask(request)
            except RustReadTimeout:
                self._stop()  # no blocked process is left for the next read
                raise

    def close(self) -> None:
        with self._lock:
            self._stop()

    @property
    def pid(self) -> int | None:
        """The child's process id, while one runs."""
        return None if self._child is None else self._child.pid

    def _ask(self, request: dict[str, Any]) -> pa.Table:
        child = self._started()
        assert child.stdin is not None and child.stdout is not None
        payload = pickle.dumps(request)
        child.stdin.write(_LENGTH.pack(len(payload)) + payload)
        child.stdin.flush()
        deadline = time.monotonic() + self.seconds
        status = _receive(child.stdout, 1, deadline)
        (size,) = _LENGTH.unpack(_receive(child.stdout, _LENGTH.size, deadline))
        body = _receive(child.stdout, size, deadline)
        if status == _FAILED:
            raise AssertionError(f"iceberg-rust could not read the table: {body.decode()}")
        with pa.ipc.open_stream(body) as stream:
            return stream.read_all()

    def _started(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "tests.rust_reader"],
                cwd=_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert self._child.stdout is not None
            ready = _receive(self._child.stdout, 1, time.monotonic() + START_SECONDS)
            assert ready == _READY, f"the iceberg-rust reader process said {ready!r}"
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def _receive(pipe: IO[bytes], n: int, deadline: float) -> bytes:
    """Exactly ``n`` bytes from the child, or :class:`RustReadTimeout` at ``deadline``."""
    fd = pipe.fileno()
    parts: list[bytes] = []
    left = n
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fd], [], [], wait)[0]:
            raise RustReadTimeout("the iceberg-rust reader gave no answer in time")
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            raise AssertionError("the iceberg-rust reader process died (see its stderr)")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


_shared: RustReader | None = None


def shared_reader() -> RustReader:
    """The test run's one reader process, stopped when the run ends."""
    global _shared
    if _shared is None:
        _shared = RustReader()
        atexit.register(_shared.close)
    return _shared


# THE CHILD


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    import datafusion
    from pyiceberg_core.datafusion import IcebergDataFusionTable

    ctx = datafusion.SessionContext()
    answers.write(_READY)
    answers.flush()
    while header := requests.read(_LENGTH.size):
        (size,) = _LENGTH.unpack(header)
        request = pickle.loads(requests.read(size))
        try:
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
                arrow = frame.to_arrow_table()
            finally:
                ctx.deregister_table("t")
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, arrow.schema) as writer:
                writer.write_table(arrow)
            status, body = _OK, sink.getvalue().to_pybytes()
        except Exception as exc:  # reported to the test, which fails with it
            status, body = _FAILED, f"{type(exc).__name__}: {exc}".encode()
        answers.write(status + _LENGTH.pack(len(body)) + body)
        answers.flush()


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints cannot break answers
    _serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
