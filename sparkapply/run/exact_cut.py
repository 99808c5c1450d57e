"""A cut at an exact LSN, made by the mirror: asked of the running ``run``, or made
here by running the subscriber until it is.

A request file asks for the cut (:mod:`sparkapply.changes.cut_requests`); whoever
applies the slot's stream serves it. ``sparkapply cut --at-lsn`` waits for a run to
do so (:func:`wait_for_cut`). ``verify`` needs the cut now (:func:`bring_to_cut`):

- when a ``run`` lives (it holds ``work_dir/run.lock``, ``state/presence.py``, also
  between two sessions) or holds the slot (``pg_replication_slots.active_pid``), it
  waits for that run, reading the catalog about once a second, and watches it: a run
  that goes away (neither for :data:`GONE_AFTER` seconds) is reported instead of
  waiting out the timeout;
- when none does, it runs the subscriber here, as ``run --until-caught-up`` does,
  until the batch that ends exactly at the request has recorded the cut (or found
  that the mirror is already past it), then stops: nothing above the point is
  applied, and the next ``run`` goes on from there.

A ``run`` started while the subscriber runs here finds the slot in use and waits for
it (``source/publisher.py``, ``ensure_slot``), as after a crash.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from sparkapply.changes.cut_requests import CutRequests
from sparkapply.config import Config
from sparkapply.errors import CutError, CutPassedError, SlotError
from sparkapply.lsn import Lsn
from sparkapply.sink.catalog import open_catalog
from sparkapply.sink.cuts import Cut, cuts_identifier, read_cuts
from sparkapply.source.connection import connect
from sparkapply.state.layout import run_lock
from sparkapply.state.presence import run_alive

if TYPE_CHECKING:
    import psycopg
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

POLL = 1.0  # seconds between reads of the catalog (and the slot) while waiting
FILE_POLL = 0.1  # seconds between looks at the request's file (a local directory)
PROGRESS_EVERY = 15.0  # seconds between log lines saying how far the run has come
# Neither the run's lock nor the slot held this long: the run is gone (a run restarted
# by a service manager takes the lock again within it).
GONE_AFTER = 5.0


def wait_for_cut(
    config: Config, lsn: Lsn, *, timeout: float, catalog: Catalog | None = None
) -> Cut:
    """The cut at exactly ``lsn``: asks the mirror to make it (a file under
    ``work_dir``, served by the running ``sparkapply run`` or the next one) and waits
    up to ``timeout`` seconds. Raises :class:`~sparkapply.errors.CutError` when it
    does not come, or cannot (the mirror is already past ``lsn``)."""
    if not run_alive(config.work_dir):
        log.info(
            "no sparkapply run is running on %s: the cut at %s waits for the next one "
            "(up to %gs here)",
            config.work_dir,
            lsn,
            timeout,
        )
    return _Waiter(config, lsn, catalog).wait(timeout, watch=None)


def bring_to_cut(
    config: Config, lsn: Lsn, *, timeout: float, spark: Any, catalog: Catalog | None = None
) -> Cut:
    """The cut at exactly ``lsn``, asked of the running ``run`` or, when none holds
    the slot, made here by the subscriber (see the module doc)."""
    waiter = _Waiter(config, lsn, catalog)
    found = waiter.found()
    if found is not None:
        return found
    holder = slot_holder(config)
    if holder is not None or run_alive(config.work_dir):
        log.info("sparkapply run is running on slot %s: asking it", config.source.slot)
        return waiter.wait(timeout, watch=config)
    log.info(
        "no sparkapply run holds slot %s: bringing the mirror to %s here",
        config.source.slot,
        lsn,
    )
    try:
        return _run_to(config, lsn, timeout, spark, waiter)
    except SlotError:
        if slot_holder(config) is None and not run_alive(config.work_dir):
            raise
        log.info("a sparkapply run took slot %s meanwhile: asking it", config.source.slot)
        return waiter.wait(timeout, watch=config)


def slot_holder(config: Config) -> int | None:
    """The pid of the walsender holding the slot (a ``run`` streams from it), or None;
    a missing slot is an error: there is no mirror to bring anywhere."""
    src = config.source
    with connect(
        src.dsn, application_name="sparkapply verify", connect_timeout=src.connect_timeout
    ) as conn:
        return _holder(conn, src.slot)


def _holder(conn: psycopg.Connection[Any], slot: str) -> int | None:
    return _slot(conn, slot)[0]


def _slot(conn: psycopg.Connection[Any], slot: str) -> tuple[int | None, str]:
    """The walsender holding the slot (or None) and the position the mirror confirmed."""
    row = conn.execute(
        "SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        raise SlotError(
            f"replication slot {slot!r} does not exist: there is no mirror to verify",
            hint="start `sparkapply run` (it creates the slot and copies the tables), then "
            "run this again",
        )
    return (None if row[0] is None else int(row[0])), str(row[1])


def _run_to(config: Config, lsn: Lsn, timeout: float, spark: Any, waiter: _Waiter) -> Cut:
    """Run the subscriber here until the requested cut at ``lsn`` is served, within
    ``timeout`` seconds."""
    from sparkapply.run.subscriber import Subscriber  # the apply's imports: only when run here

    waiter.requests.add(lsn)
    sub = Subscriber(config, spark=spark, catalog=waiter.catalog)
    timer = threading.Timer(timeout, sub.stop)
    timer.daemon = True
    timer.start()
    try:
        summary = sub.run(until_cut=lsn)
    finally:
        timer.cancel()
    found = waiter.found()
    if found is not None:
        log.info("the mirror is at %s: %d transactions applied", lsn, summary.transactions)
        return found
    if lsn in waiter.requests.pending():
        raise CutError(
            f"the mirror did not reach {lsn} within {timeout:g}s (applied up to "
            f"{summary.flushed}, {summary.transactions} transactions)",
            lsn=lsn,
            hint="run this again with a longer --timeout (it goes on from there), or let "
            "`sparkapply run --until-caught-up` catch up first",
        )
    raise waiter.passed()


class _Waiter:
    """Reads the cuts table for the cut at ``lsn``, and the request's file."""

    def __init__(self, config: Config, lsn: Lsn, catalog: Catalog | None) -> None:
        self.config = config
        self.lsn = lsn
        self.catalog = catalog or open_catalog(
            config.sink.catalog_name, config.catalog_properties()
        )
        self.ident = cuts_identifier(config.sink.cuts_table)
        self.requests = CutRequests(config.work_dir, interval=0.0)

    def found(self) -> Cut | None:
        if not self.catalog.table_exists(self.ident):
            return None
        cuts = read_cuts(self.catalog.load_table(self.ident), at_most=self.lsn)
        return cuts[-1] if cuts and cuts[-1].lsn == self.lsn else None

    def timed_out(self, timeout: float) -> CutError:
        return CutError(
            f"no cut at {self.lsn} after {timeout:g}s: `sparkapply run` is not running, or "
            "has not reached that LSN yet",
            lsn=self.lsn,
            hint="the request stays under work_dir/cut-requests; a later run makes the cut "
            "(run this again to wait for it), or remove the file to cancel",
        )

    def passed(self) -> CutPassedError:
        return CutPassedError(
            f"no cut can be made at exactly {self.lsn}: the mirror already holds "
            "transactions after it",
            lsn=self.lsn,
            hint=f"`sparkapply cut --lsn {self.lsn}` gives the newest cut at or before it",
        )

    def wait(self, timeout: float, *, watch: Config | None) -> Cut:
        """Wait for the cut; with ``watch``, for the run holding its slot, which must
        not go away."""
        found = self.found()
        if found is not None:
            return found
        self.requests.add(self.lsn)
        deadline = time.monotonic() + timeout
        slot = _SlotWatch(watch, self.lsn) if watch is not None else None
        read_at = float("-inf")
        try:
            while True:
                # The run removes the request once the cut is committed: the file is
                # looked at often, the catalog read when it went, or once a second.
                served = self.lsn not in self.requests.pending()
                now = time.monotonic()
                if served or now - read_at >= POLL or now >= deadline:
                    read_at = now
                    found = self.found()
                    if found is not None:
                        return found
                    if served:  # dropped: the mirror is past it
                        raise self.passed()
                    if slot is not None:
                        slot.check()
                    if now >= deadline:
                        raise self.timed_out(timeout)
                time.sleep(min(FILE_POLL, max(0.0, deadline - now)))
        finally:
            if slot is not None:
                slot.close()


class _SlotWatch:
    """The run holding the slot, watched while its cut is awaited: how far it is (in
    the log now and then), and whether it went away."""

    def __init__(self, config: Config, lsn: Lsn) -> None:
        src = config.source
        self.work_dir = config.work_dir
        self.slot = src.slot
        self.lsn = lsn
        self.conn = connect(
            src.dsn, application_name="sparkapply verify", connect_timeout=src.connect_timeout
        )
        self.told = time.monotonic()
        self.gone_since: float | None = None

    def check(self) -> None:
        holder, confirmed = _slot(self.conn, self.slot)
        now = time.monotonic()
        if now - self.told >= PROGRESS_EVERY:
            self.told = now
            log.info("waiting for the cut at %s; the run has confirmed %s", self.lsn, confirmed)
        if holder is not None or run_alive(self.work_dir):
            self.gone_since = None
        elif self.gone_since is None:
            self.gone_since = now
        elif now - self.gone_since >= GONE_AFTER:
            raise CutError(
                f"sparkapply run stopped before making the cut at {self.lsn} (no run holds "
                f"slot {self.slot} or {run_lock(self.work_dir)})",
                lsn=self.lsn,
                hint="run this again: with no run holding the slot, verify brings the "
                "mirror to the point itself",
            )

    def close(self) -> None:
        self.conn.close()
