"""A batch's failure, said so that the operator can act: Spark's own failures as
transient errors, and an apply error named by its transaction, with how to skip it."""

from __future__ import annotations

from concurrent.futures import Future

from sparkapply.errors import (
    ErrorKind,
    InternalError,
    LocationError,
    SparkapplyError,
    SparkJobError,
)
from sparkapply.plan.scheduler import Batch
from sparkapply.run.batch import BatchStats


def spark_job_error(exc: BaseException) -> SparkJobError | None:
    """A failure of Spark itself (Py4J, a lost executor or Python worker, a cancelled
    job) as a transient error; None for anything else (a bug in our driver code). Our
    task code returns its own errors as values, so they never arrive here."""
    module = type(exc).__module__ or ""
    if not module.startswith(("py4j", "pyspark")):
        return None
    first = (str(exc).strip().splitlines() or [""])[0][:500]
    return SparkJobError(
        f"the batch's Spark job failed: {type(exc).__name__}: {first}",
        hint="nothing of the batch was committed or acknowledged; it is applied again "
        "from the publisher's stream when the session starts again",
    )


def outcome(fut: Future[tuple[BatchStats, float]], batch: Batch) -> tuple[BatchStats, float]:
    """The batch's result, or its error naming the transaction to skip."""
    try:
        return fut.result()
    except SparkapplyError as exc:
        raise _locate(exc, batch) from exc.__cause__


def _locate(exc: SparkapplyError, batch: Batch) -> SparkapplyError:
    """Name the failing transaction (xid and commit LSN) when the error tells which one
    it is, and how to skip it when retrying cannot help."""
    txns = batch.txns
    xid = exc.context.get("xid")
    lsn = exc.context.get("lsn")
    found = next((t for t in txns if xid is not None and t.xid == xid), None)
    if found is None and lsn is not None:
        found = next((t for t in txns if int(t.commit_lsn) == int(lsn)), None)
    if found is None and len(txns) == 1:
        found = txns[0]
    if found is None:
        return exc
    exc.with_context(xid=found.xid, lsn=found.commit_lsn)
    exc.context["lsn"] = found.commit_lsn  # the commit LSN, which `skip` takes
    # Skipping cannot help a bug, nor storage the operator must fix.
    if exc.kind is not ErrorKind.TRANSIENT and not isinstance(exc, InternalError | LocationError):
        skip = (
            f"to drop this one transaction instead: sparkapply skip --config <file> "
            f"--lsn {found.commit_lsn}"
        )
        exc.hint = f"{exc.hint}; {skip}" if exc.hint else skip
    return exc
