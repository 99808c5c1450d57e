"""A reader of Iceberg tables in a child process of its own: the plumbing the
iceberg-rust reader (:mod:`tests.rust_reader`) and Iceberg's Java runtime
(:mod:`tests.java_reader`) share.

The parent writes one request a read (JSON, length-prefixed) to the child's stdin; the
child answers on the stdout it was started with: a status byte, a length and the rows
as an Arrow IPC stream (or the error's text). A read that has not answered in time kills
the child, starts a new one and is tried once more: a blocked read cannot be cancelled
from Python, a process can be killed. The child's start (its imports, a JVM's start) is
not counted against a read.

This module is imported in both processes, and the child's Python may be another
environment than the tests' (Java's runs pyspark 3.5): it needs the standard library
and pyarrow only.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

_LENGTH = struct.Struct("<Q")
_READY, _OK, _FAILED = b"R", b"+", b"-"
ROOT = Path(__file__).resolve().parent.parent
"""The repository's root: the child's working directory, so ``-m tests.…`` imports."""


class ReaderTimeout(TimeoutError):
    """The child gave no answer in time."""


class ReaderProcess:
    """One child process reading tables, started on first use.

    ``command`` starts the child (it must call :func:`serve`), ``name`` names the reader
    in messages; a read may take ``seconds``, the child's start ``start_seconds``."""

    def __init__(
        self,
        command: list[str],
        name: str,
        seconds: float,
        start_seconds: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.command = command
        self.name = name
        self.seconds = seconds
        self.start_seconds = start_seconds
        self.env = None if env is None else dict(env)
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.reads = 0
        """Reads answered, and the seconds they and the children's starts took (what
        the reader adds to a test run)."""
        self.read_seconds = 0.0
        self.start_seconds_spent = 0.0

    def ask(self, request: dict[str, Any]) -> pa.Table:
        """The child's answer to ``request``, tried in a second child if the first gave
        none in time."""
        with self._lock:
            try:
                return self._ask(request)
            except ReaderTimeout:
                self._stop()  # blocked: once more, in a new process
            try:
                return self._ask(request)
            except ReaderTimeout:
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
        began = time.monotonic()
        try:
            return self._answer(child, request)
        finally:
            self.reads += 1
            self.read_seconds += time.monotonic() - began

    def _answer(self, child: subprocess.Popen[bytes], request: dict[str, Any]) -> pa.Table:
        assert child.stdin is not None and child.stdout is not None
        payload = json.dumps(request).encode()
        child.stdin.write(_LENGTH.pack(len(payload)) + payload)
        child.stdin.flush()
        deadline = time.monotonic() + self.seconds
        status = self._receive(child.stdout, 1, deadline)
        (size,) = _LENGTH.unpack(self._receive(child.stdout, _LENGTH.size, deadline))
        body = self._receive(child.stdout, size, deadline)
        if status == _FAILED:
            raise AssertionError(f"{self.name} could not read the table: {body.decode()}")
        with pa.ipc.open_stream(body) as stream:
            return stream.read_all()

    def _started(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            began = time.monotonic()
            self._child = subprocess.Popen(
                self.command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env
            )
            assert self._child.stdout is not None
            deadline = time.monotonic() + self.start_seconds
            ready = self._receive(self._child.stdout, 1, deadline)
            assert ready == _READY, f"the {self.name} reader process said {ready!r}"
            self.start_seconds_spent += time.monotonic() - began
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

    def _receive(self, pipe: IO[bytes], n: int, deadline: float) -> bytes:
        """Exactly ``n`` bytes from the child, or :class:`ReaderTimeout` at ``deadline``."""
        fd = pipe.fileno()
        parts: list[bytes] = []
        left = n
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise ReaderTimeout(f"the {self.name} reader gave no answer in time")
            part = os.read(fd, min(left, 1 << 20))
            if not part:
                raise AssertionError(f"the {self.name} reader process died (see its stderr)")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)


# THE CHILD


def serve(read: Callable[[dict[str, Any]], pa.Table]) -> None:
    """The child's loop: say it is ready, then answer each request on stdin with
    ``read(request)``, or with the error it raised. Anything else the child prints goes
    to stderr, so a stray print cannot break an answer."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    requests = sys.stdin.buffer
    answers.write(_READY)
    answers.flush()
    while header := requests.read(_LENGTH.size):
        (size,) = _LENGTH.unpack(header)
        request = json.loads(requests.read(size))
        try:
            arrow = read(request)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, arrow.schema) as writer:
                writer.write_table(arrow)
            status, body = _OK, sink.getvalue().to_pybytes()
        except Exception as exc:  # reported to the test, which fails with it
            status, body = _FAILED, f"{type(exc).__name__}: {exc}".encode()
        answers.write(status + _LENGTH.pack(len(body)) + body)
        answers.flush()
