"""CPU seconds of process trees and of one thread, read from the kernel, and load.

Every benchmark reports what a run cost in CPU next to its wall time: on a shared
2-core machine a run that waited for the CPU and one that used it look alike in
seconds only.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from benchlib.report import log

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


# Processes by identity: a pid with its start time, which survives pid reuse.


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, an identity
    that survives pid reuse), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def signal_alive(procs: list[tuple[int, int]], sig: int) -> None:
    """Send ``sig`` to each (pid, start time) that is still that process."""
    for pid, started in procs:
        if start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def stop_tree(root: int) -> list[tuple[int, int]]:
    """SIGSTOP ``root`` and everything below it; the processes stopped. Parents are
    stopped before their children, and the tree is looked at again until nothing new
    appears (a stopped parent starts no one)."""
    stopped: dict[int, int] = {}
    for _ in range(10):
        new = [pid for pid in process_tree(root) if pid not in stopped]
        if not new:
            break
        for pid in new:
            started = start_time(pid)
            if started is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped[pid] = started
    return list(stopped.items())


def wait_quiet(
    root: int, *, window: float = 1.0, max_cpu: float = 0.15, timeout: float = 60.0
) -> float:
    """Wait until ``root``'s tree uses less than ``max_cpu`` CPU seconds in ``window``
    seconds (an idle consumer: a finished batch's maintenance is done); the seconds
    waited. Gives up after ``timeout``, saying so."""
    started = time.monotonic()
    while True:
        before = tree_cpu(root)
        time.sleep(window)
        if tree_cpu(root) - before < max_cpu:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            log(f"process {root} still busy after {timeout:.0f}s; going on")
            return time.monotonic() - started
