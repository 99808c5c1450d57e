"""A way for another thread to end the receiving thread's wait.

The receiving thread waits in ``select`` for the walsender (up to its poll timeout)
and sleeps between paced reads (``stream.BURST_PACE``). A batch that completes
meanwhile is acknowledged only when the thread comes back to it: in the race that
was up to 50 ms after the batch, 25 ms on average, for every batch. A
:class:`Wakeup` is a pipe whose read end those waits include: :meth:`set`, from any
thread, ends the wait at once, or the next one if none is under way.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading


class Wakeup:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        # A set() racing close() must not write to a descriptor number reused since.
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        """End the current or next wait (thread-safe; after :meth:`close`, nothing)."""
        with self._lock, contextlib.suppress(BlockingIOError):  # full: woken already
            if not self._closed:
                os.write(self._write, b"\0")

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s; True, at once, if :meth:`set` was called."""
        ready, _, _ = select.select([self._read], [], [], max(0.0, timeout))
        return bool(ready) and self.take()

    def take(self) -> bool:
        """Whether :meth:`set` was called since the last take (it is then undone)."""
        woken = False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 512):
                woken = True
        return woken

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._read)
            os.close(self._write)
