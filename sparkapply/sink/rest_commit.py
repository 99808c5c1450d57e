"""A batch in one request to a REST catalog: ``POST /v1/{prefix}/transactions/commit``.

The Iceberg REST specification's multi-table commit takes every table's requirements
and updates at once and applies all of them or none (a failed requirement is a 409
and changes nothing). pyiceberg's client does not send it; this module does, through
the catalog's own HTTP session (its auth, token refresh and headers), with pyiceberg's
``CommitTableRequest`` for each table, so the body is what pyiceberg would send table
by table, in one list.

WHO TAKES IT
    A server that lists its endpoints in ``GET /v1/config`` says so there; one that
    lists none (SeaweedFS, older servers) is asked once per catalog with an empty list
    of changes, which commits nothing: a 2xx means the route exists. Elsewhere batches
    commit table by table (``commit.commit_staged``), and the log and ``status`` say so.

OUTCOMES
    2xx: every table moved; each is re-read (the response carries no metadata). 409:
    nothing moved (a table changed since the batch planned): the manifests written for
    the batch are deleted and :class:`CommitConflictError` re-plans it. No answer, or a
    5xx: the request may have landed for all tables or for none, so the first table
    tells (:func:`resolve_unclear_outcome`), before anything is retried or deleted.
    Any other refusal deletes the manifests and stops with the server's message.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Sequence

import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.table import CommitTableRequest, Namespace, TableIdentifier

from sparkapply.errors import CommitConflictError, SinkError
from sparkapply.failpoints import failpoint
from sparkapply.sink.commit import StagedSnapshot, resolve_unclear_outcome
from sparkapply.sink.files import delete_paths
from sparkapply.sink.tables import table_name

logger = logging.getLogger(__name__)

ENDPOINT = "POST /v1/{prefix}/transactions/commit"
_PATH = "transactions/commit"
# Answers that say the request may have been applied.
_UNKNOWN = (500, 502, 503, 504)
_PROBED: weakref.WeakKeyDictionary[RestCatalog, bool] = weakref.WeakKeyDictionary()


def multi_table_commit(catalog: RestCatalog) -> bool:
    """Whether ``catalog``'s server takes the multi-table commit (see WHO TAKES IT)."""
    known = _PROBED.get(catalog)
    if known is None:
        known = _probe(catalog)
        _PROBED[catalog] = known
    return known


def _probe(catalog: RestCatalog) -> bool:
    advertised = {str(e) for e in getattr(catalog, "_supported_endpoints", ())}
    if any(e.endswith("/transactions/commit") for e in advertised):
        return True
    try:
        response = catalog._session.post(catalog.url(_PATH), data='{"table-changes": []}')
    except requests.RequestException as exc:
        logger.info("REST catalog: cannot ask for the multi-table commit: %s", exc)
        return False
    return 200 <= response.status_code < 300


def commit_rest(catalog: RestCatalog, staged: Sequence[StagedSnapshot]) -> None:
    """Commit every staged change in one request, or none (see OUTCOMES). On success
    each table object holds its new metadata."""
    changes = [_change(one) for one in staged]
    body = json.dumps({"table-changes": changes})
    failpoint("before-catalog-swap")
    try:
        response = catalog._session.post(catalog.url(_PATH), data=body)
    except requests.RequestException as exc:
        _resolve(staged, exc)
    else:
        _check(response, staged)
    failpoint("after-catalog-swap")
    for one in staged:  # the response holds no metadata
        one.table.refresh()
    logger.debug("committed %d tables in one REST request", len(staged))


def _change(one: StagedSnapshot) -> dict[str, object]:
    ident = one.table.name()
    request = CommitTableRequest(
        identifier=TableIdentifier(namespace=Namespace(list(ident[:-1])), name=ident[-1]),
        requirements=tuple(one.delta.requirements),
        updates=tuple(one.delta.updates),
    )
    change: dict[str, object] = json.loads(request.model_dump_json())
    return change


def _check(response: requests.Response, staged: Sequence[StagedSnapshot]) -> None:
    status = response.status_code
    if 200 <= status < 300:
        return
    first = staged[0]
    message = _server_message(response)
    if status in _UNKNOWN:
        _resolve(staged, SinkError(f"HTTP {status}: {message}"))
        return
    for one in staged:
        delete_paths(one.table.io, one.delta.written)
    if status == 409:
        raise CommitConflictError(
            f"the catalog refused the batch: {message}",
            table=table_name(first.table),
            lsn=first.lsn,
            hint="nothing of the batch was committed; re-load the tables and re-plan it",
        )
    raise SinkError(
        f"the catalog refused the batch's commit (HTTP {status}): {message}",
        table=table_name(first.table),
        lsn=first.lsn,
        hint="nothing of the batch was committed; set [sink] atomic_commit = false to "
        "commit table by table if the server cannot take multi-table commits",
    )


def _server_message(response: requests.Response) -> str:
    try:
        error = response.json().get("error", {})
        return f"{error.get('type', '')}: {error.get('message', '')}"[:500]
    except ValueError:
        return response.text[:500]


def _resolve(staged: Sequence[StagedSnapshot], exc: Exception) -> None:
    """The request's outcome is unknown: it landed for every table or for none, so the
    first table tells (re-read). Return if it landed; raise otherwise."""
    first = staged[0]
    resolve_unclear_outcome(first.table, first.snapshot_id, first.lsn, exc, landed=first.landed)
