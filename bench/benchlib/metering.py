"""CPU seconds of process trees and of one thread, read from the kernel, and load.

Every benchmark reports what a run cost in CPU next to its wall time: on a shared
2-core machine a run that waited for the CPU and one that used it look alike in
seconds only.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

_TICK = os.sysconf("SC_CLK_TCK")


def loadavg() -> float:
    """The 1-minute load average (other users of the machine, before a run)."""
    return os.getloadavg()[0]


def reset_peak_rss() -> None:
    """Start this process's peak RSS (VmHWM) over from its current RSS (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # then the peak is the process's lifetime peak


def peak_rss_mib() -> float | None:
    """This process's peak resident memory in MiB (VmHWM), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _stat_fields(path: str) -> list[str] | None:
    """The fields of a ``/proc/.../stat`` after the command name (which may hold
    spaces and parentheses); None if the process or thread is gone."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _proc_table() -> tuple[dict[int, int], dict[int, int]]:
    """Every live process's parent, and its CPU ticks (utime stime cutime cstime)."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(f"/proc/{entry}/stat")
        if fields is None:
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])
    return parent, ticks


def descendants(parent: Mapping[int, int], root: int) -> list[int]:
    """``root`` and every process below it in ``parent`` (pid -> parent pid), parents
    before their children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(children.get(pid, ())))
    return out


def process_tree(root: int) -> list[int]:
    """``root`` (if alive) and its live descendants, parents first. Found by parent
    links, not process groups: Spark's Python worker daemon makes a group of its own."""
    parent, _ = _proc_table()
    return [pid for pid in descendants(parent, root) if pid in parent]


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by ``root`` and every process below it.

    utime + stime of the live processes, plus cutime + cstime: what their children
    that have exited and been waited for used (a walsender reaped by the postmaster,
    pg_recvlogical reaped by us). Differences of two readings are what a run cost.
    """
    parent, ticks = _proc_table()
    return sum(ticks.get(pid, 0) for pid in descendants(parent, root)) / _TICK


@dataclass(slots=True)
class CpuMeter:
    """CPU seconds of the consumer's processes and of the publisher over one run."""

    consumer_root: int
    publisher_root: int
    consumer: float = 0.0
    publisher: float = 0.0
    _start: tuple[float, float] = (0.0, 0.0)

    def __enter__(self) -> CpuMeter:
        self._start = (tree_cpu(self.consumer_root), tree_cpu(self.publisher_root))
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer = tree_cpu(self.consumer_root) - self._start[0]
        self.publisher = tree_cpu(self.publisher_root) - self._start[1]

    def as_dict(self) -> dict[str, float]:
        return {"consumer": round(self.consumer, 2), "publisher": round(self.publisher, 2)}


@dataclass(slots=True)
class ThreadCpuSampler:
    """Samples one thread's CPU clock every ``interval`` seconds while in use, so that
    its CPU between two instants seen elsewhere (as ``time.monotonic()``) can be read
    afterwards: how busy was the receiving thread while it received?

    The thread's own CPU clock (nanoseconds) rather than /proc's 10 ms ticks: the
    phases measured can be a fraction of a second.
    """

    thread: threading.Thread
    interval: float = 0.01
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None

    def __enter__(self) -> ThreadCpuSampler:
        assert self.thread.ident is not None
        clock = time.pthread_getcpuclockid(self.thread.ident)

        def sample() -> None:
            while True:
                self.times.append(time.monotonic())
                self.cpu.append(time.clock_gettime(clock))
                if self._stop.wait(self.interval):
                    return

        self._sampler = threading.Thread(target=sample, name="bench-cpu-sampler", daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()

    def at(self, when: float) -> float:
        """The thread's CPU seconds at ``when``, interpolated between samples."""
        i = bisect.bisect_left(self.times, when)
        if i <= 0:
            return self.cpu[0]
        if i >= len(self.times):
            return self.cpu[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        c0, c1 = self.cpu[i - 1], self.cpu[i]
        return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1

    def between(self, start: float, end: float) -> float:
        return self.at(end) - self.at(start)
