"""The collector's pause (sparkapply/collector.py): counted across threads, so one
thread's pause ending does not end another's."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from sparkapply import collector


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_a_pause_turns_the_collector_off_and_on_again() -> None:
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause is still on
    assert gc.isenabled()


def test_a_collector_turned_off_elsewhere_stays_off() -> None:
    gc.disable()
    with collector.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_one_threads_pause_ending_leaves_anothers_on() -> None:
    """The apply thread starts a batch inside a burst of the receiving thread, and the
    burst ends first: the collector stays off until the batch's pause ends too."""
    inside = threading.Event()
    leave = threading.Event()
    seen: list[bool] = []

    def apply_thread() -> None:
        with collector.paused():
            inside.set()
            leave.wait(30)
            seen.append(gc.isenabled())

    worker = threading.Thread(target=apply_thread)
    try:
        with collector.paused():  # a burst of the receiving thread
            worker.start()
            assert inside.wait(30)
        assert not gc.isenabled()
        for _ in range(3):  # more bursts, while the batch runs
            with collector.paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
    finally:
        leave.set()
        worker.join(30)
    assert seen == [False]
    assert gc.isenabled()  # both out: collections run again
