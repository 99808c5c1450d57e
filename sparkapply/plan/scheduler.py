"""The batch scheduler: when a batch is cut, what a finished batch acknowledges, when
the subscriber is idle, and the operator's skip of one transaction.

CONTRACT
    The receiving thread owns the scheduler and calls it once per loop turn, after
    feeding a receive burst to the assembler:

    ``received(got_frames, caught_up)``
        notes when the oldest waiting transaction became ready, and whether the
        stream paused: the burst was empty, or the walsender said it has sent all
        there is (``caught_up``, see :mod:`sparkapply.source.stream`).
    ``cut(now)`` → :class:`Batch` or None
        a batch to apply now. At most one batch runs: None while one does, and after
        :meth:`stop`. A batch closes when the stream paused, when it is full
        (``batch_max_bytes`` / ``batch_max_transactions``), when its oldest
        transaction has waited ``batch_linger``, or when its oldest
        transaction was ready before the last batch completed: while a batch runs,
        the next gathers (group commit), so under a steady load a batch is cut as
        soon as the one before it is durable, not a linger later. While a backlog
        drains, applying one batch overlaps receiving the next.
    ``complete(batch)``
        only once every table of the batch is committed in Iceberg. Marks its
        transactions done, so the flush LSN may pass them (durable before
        acknowledged), and releases their spool. A batch whose apply failed is
        never completed: the session ends and the server re-sends it.
    ``idle()``
        nothing runs, nothing is ready, no ordinary transaction is half received and
        nothing waits for acknowledgement: the flush LSN may follow the server's
        position (liveness: an idle publication does not retain WAL).
    ``stop()`` / ``may_exit()``
        after stop no batch is cut; the caller exits once the running one completed.

REQUESTED CUTS
    A batch never spans a requested cut (:mod:`sparkapply.changes.cut_requests`): it
    ends at the last transaction at or below it, and once every transaction up to it
    is applied and none above, an empty batch records the cut. While a hold lasts, no
    transaction above its floor is taken.

SKIP
    A transaction whose finish LSN matches the skip record (see
    :mod:`sparkapply.changes.skip`) is taken out of the batch at cut time, marked done
    and released without being applied, and logged. ``skipped_through`` is then its end
    LSN: once the flush LSN sent to the server reaches it, the caller calls
    :meth:`forget_skip` and the record is removed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkapply.changes.assembler import Assembler
from sparkapply.changes.cut_requests import CutRequests
from sparkapply.changes.prepared import PreparedStore
from sparkapply.changes.progress import Progress
from sparkapply.changes.skip import SkipStore
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.config import ApplyConfig
from sparkapply.lsn import Lsn

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Batch:
    items: tuple[tuple[CommittedTxn, list[int]], ...]  # (transaction, progress item)
    cut_at: float  # time.monotonic() when it was cut
    # A requested cut (changes/cut_requests.py) the tables are exactly at once this
    # batch is applied; a batch with no items only records that cut.
    requested: Lsn | None = None

    @property
    def txns(self) -> list[CommittedTxn]:
        return [t for t, _ in self.items]

    def __len__(self) -> int:
        return len(self.items)


class BatchScheduler:
    def __init__(
        self,
        assembler: Assembler,
        progress: Progress,
        limits: ApplyConfig,
        *,
        skips: SkipStore | None = None,
        prepared: PreparedStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        cut_requests: CutRequests | None = None,
    ) -> None:
        self._assembler = assembler
        self._cut_requests = cut_requests
        self._progress = progress
        self._limits = limits
        self._skips = skips
        self._prepared = prepared
        self._clock = clock
        self._ready_since: float | None = None
        self._completed_at: float | None = None  # when the last batch completed
        self._running: Batch | None = None
        self._stopping = False
        self._paused = False
        self.skipped_through: Lsn | None = None  # end LSN of a skipped transaction
        self._skipped_lsn: Lsn | None = None

    @property
    def running(self) -> Batch | None:
        return self._running

    def received(self, got_frames: bool, caught_up: bool = False) -> None:
        self._paused = not got_frames or caught_up
        if self._ready_since is None and self._assembler.backlog().transactions:
            self._ready_since = self._clock()

    def cut(self) -> Batch | None:
        if self._running is not None or self._stopping:
            return None
        requested, through = self._bounds()
        if requested is not None and self._at_request(requested):
            self._running = Batch((), self._clock(), requested=requested)
            return self._running
        backlog = self._assembler.backlog()
        if not backlog.transactions:
            return None
        lim = self._limits
        now = self._clock()
        waited = self._ready_since is not None and (
            now - self._ready_since >= lim.batch_linger
            # Gathered while the last batch ran: it has waited for that batch already.
            or (self._completed_at is not None and self._ready_since <= self._completed_at)
        )
        full = (
            backlog.nbytes >= lim.batch_max_bytes
            or backlog.transactions >= lim.batch_max_transactions
        )
        if not (waited or full or self._paused):
            return None
        items = self._assembler.take_ready(
            lim.batch_max_bytes, lim.batch_max_transactions, through=through
        )
        if not items:  # held: what waits keeps its place
            return None
        self._ready_since = now if self._assembler.backlog().transactions else None
        items = self._drop_skipped(items)
        if not items:
            return None
        self._running = Batch(tuple(items), now)
        return self._running

    # -- requested cuts -----------------------------------------------------------------

    def _requested(self) -> Lsn | None:
        """The lowest requested cut, if any (a batch never spans it)."""
        if self._cut_requests is None:
            return None
        pending = self._cut_requests.pending()
        return pending[0] if pending else None

    def _bounds(self) -> tuple[Lsn | None, Lsn | None]:
        """The requested cut to record once reached, and the highest commit LSN a
        batch may take: a batch spans neither a requested cut nor a hold's floor, and
        a request above a hold waits for it to go."""
        requested = self._requested()
        held = self._cut_requests.held() if self._cut_requests is not None else None
        through = min((x for x in (requested, held) if x is not None), default=None)
        return (requested if requested == through else None), through

    def _at_request(self, lsn: Lsn) -> bool:
        """Every transaction at or below ``lsn`` is applied and none above it: the next
        one waiting is above it, or nothing waits and the server is past it."""
        first = self._assembler.first_ready()
        if first is not None:
            return first.commit_lsn > lsn
        backlog = self._assembler.backlog()
        return (
            not backlog.receiving and self._progress.pending == 0 and self._progress.flushed >= lsn
        )

    def cut_requested(self) -> bool:
        return self._requested() is not None

    def cut_recorded(self, lsn: Lsn) -> None:
        """The requested cut at ``lsn`` exists, or cannot be made: forget the request."""
        if self._cut_requests is not None:
            self._cut_requests.done(lsn)

    def complete(self, batch: Batch) -> None:
        if batch is not self._running:
            raise RuntimeError("complete() of a batch that is not the running one")
        self._running = None
        self._completed_at = self._clock()
        self._assembler.release_all([txn for txn, _ in batch.items])
        self._progress.mark_done([item for _, item in batch.items])

    def idle(self) -> bool:
        if self._running is not None:
            return False
        backlog = self._assembler.backlog()
        return not backlog.transactions and not backlog.receiving and self._progress.pending == 0

    def caught_up(self, target: Lsn) -> bool:
        """Idle, flushed to ``target``, and no requested cut at or below it waits: one
        that does is made within a turn (nothing at or below it can come any more)."""
        if not (self.idle() and self._progress.flushed >= target):
            return False
        requested = self._requested()
        return requested is None or requested > target

    def stop(self) -> None:
        self._stopping = True

    def may_exit(self) -> bool:
        return self._stopping and self._running is None

    # -- skip ---------------------------------------------------------------------------

    def _drop_skipped(
        self, items: list[tuple[CommittedTxn, list[int]]]
    ) -> list[tuple[CommittedTxn, list[int]]]:
        request = self._skips.get() if self._skips is not None else None
        if request is None:
            return items
        keep: list[tuple[CommittedTxn, list[int]]] = []
        for txn, item in items:
            if self._matches(txn, request.lsn):
                log.warning(
                    "skipped transaction xid %d (%s LSN %s, end %s) as asked by `sparkapply "
                    "skip`: %d change(s) to relation id(s) %s not applied; tables: %s",
                    txn.xid,
                    "COMMIT PREPARED" if txn.kind == "prepared" else "commit",
                    txn.commit_lsn,
                    txn.end_lsn,
                    txn.n_changes,
                    sorted(txn.relation_ids),
                    ", ".join(_tables_of(txn)) or "none",
                )
                self._assembler.release(txn)
                self._progress.mark_done([item])
                self.skipped_through = txn.end_lsn
                self._skipped_lsn = request.lsn
            else:
                keep.append((txn, item))
        # Commits arrive in LSN order: nothing later can match, unless the LSN is the
        # PREPARE of a transaction whose COMMIT PREPARED is still to come.
        past = self._skipped_lsn is None and keep and keep[-1][0].commit_lsn > request.lsn
        if past and not self._is_staged_prepare(request.lsn):
            log.warning(
                "skip LSN %s matched no transaction (the stream is past it); the skip "
                "record is removed",
                request.lsn,
            )
            assert self._skips is not None
            self._skips.clear(request.lsn)
        return keep

    def _matches(self, txn: CommittedTxn, lsn: Lsn) -> bool:
        if txn.commit_lsn == lsn:
            return True
        if txn.kind == "prepared" and self._prepared is not None:
            entry = self._prepared.get(txn.xid)
            return entry is not None and entry.prepare_lsn == lsn
        return False

    def _is_staged_prepare(self, lsn: Lsn) -> bool:
        if self._prepared is None:
            return False
        for xid in self._prepared.xids():
            entry = self._prepared.get(xid)
            if entry is not None and entry.prepare_lsn == lsn:
                return True
        return False

    def forget_skip(self) -> None:
        """The server has been told the skipped transaction is done: remove the record."""
        if self._skipped_lsn is not None and self._skips is not None:
            self._skips.clear(self._skipped_lsn)
        self._skipped_lsn = None
        self.skipped_through = None


def _tables_of(txn: CommittedTxn) -> list[str]:
    rels = {r.relation_id: r for r in txn.relation_messages}
    rels.update(txn.relations)
    touched = [r for rid, r in rels.items() if rid in txn.relation_ids]
    return sorted(f"{r.namespace or 'pg_catalog'}.{r.name}" for r in touched)
