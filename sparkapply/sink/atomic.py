"""One catalog transaction for all the tables of a batch.

PostgreSQL applies a transaction atomically across every table it touches; a mirror
that commits one table after another shows readers an order without its lines for a
moment, and keeps showing it after a crash between the two commits. Where the catalog
can swap several tables' metadata pointers in one transaction, a batch commits that
way: every table's snapshot of the batch (and its cut, ``cuts.py``) becomes visible at
once, or none does.

HOW (pyiceberg's SQL catalog: SQLite, PostgreSQL, any SQLAlchemy database)

1. Each table's snapshot is staged (``commit.stage_files``: manifests, manifest list).
2. Each table's new ``metadata.json`` is written, computed from the metadata the batch
   planned against (the table objects the apply holds). Crash: unreferenced files only.
3. One SQL transaction swaps every pointer, each ``UPDATE`` with its optimistic check:
   the row must still name the metadata file the batch planned against. If any check
   fails the transaction rolls back: nothing of the batch is visible, and the batch is
   re-planned as after any failed commit (:class:`CommitConflictError`). The
   transaction's commit is the batch's only commit point.

pyiceberg's ``commit_table`` does 2 and 3 for one table, after re-loading it (a
catalog read and a metadata read per table); here the exact-base check makes the
re-load unnecessary, which is also what makes a batch's commit cheap. The new metadata
is pyiceberg's updates applied to the metadata held (:func:`_updated`), without the deep
copy of the whole metadata pyiceberg closes with: a table's metadata holds every
snapshot it keeps (a hundred and more in a steady stream, each with its summary), and
copying them was a fifteenth of a small batch's time on the apply thread.

A REST catalog whose server takes the specification's multi-table commit gets the
batch in one request (``rest_commit.py``). Other catalogs (Glue, Hive, a REST server
without it, ...) commit table by table (``commit.commit_staged``);
the per-table applied LSN makes a restart after a crash between two of them exact for
each table (``progress.py``), but readers may see the tables at different LSNs for a
moment. :func:`atomic_commits` says which applies; the run logs it at start.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.utils.datetime import datetime_to_millis
from sqlalchemy import update
from sqlalchemy.orm import Session

from sparkapply.errors import CommitConflictError, SinkError, SparkapplyError
from sparkapply.failpoints import failpoint
from sparkapply.sink.commit import StagedSnapshot, resolve_unclear_outcome
from sparkapply.sink.files import delete_paths
from sparkapply.sink.metadata_json import METADATA_JSON
from sparkapply.sink.rest_commit import ENDPOINT as REST_ENDPOINT
from sparkapply.sink.rest_commit import commit_rest, multi_table_commit
from sparkapply.sink.tables import table_name

logger = logging.getLogger(__name__)


def atomic_commits(catalog: Catalog) -> bool:
    """Whether :func:`commit_together` can commit several tables in one transaction."""
    if isinstance(catalog, RestCatalog):
        return multi_table_commit(catalog)
    return isinstance(catalog, SqlCatalog) and bool(catalog.engine.dialect.supports_sane_rowcount)


def commit_mode(catalog: Catalog) -> str:
    """How a batch commits, for the log and ``status``."""
    if isinstance(catalog, RestCatalog):
        if atomic_commits(catalog):
            return "atomic: one REST multi-table commit per batch"
        return (
            "table by table (the REST catalog does not take the multi-table commit, "
            f"{REST_ENDPOINT})"
        )
    if atomic_commits(catalog):
        return "atomic: one catalog transaction per batch"
    return f"table by table ({type(catalog).__name__} has no multi-table commit)"


@dataclass(frozen=True, slots=True)
class _Swap:
    staged: StagedSnapshot
    metadata: TableMetadata  # as written to metadata_location
    metadata_location: str  # the metadata file written, for the pointer to name


def commit_together(catalog: Catalog, staged: Sequence[StagedSnapshot]) -> None:
    """Commit every staged snapshot in one catalog transaction, or none of them.

    Raises :class:`CommitConflictError` (nothing committed: a table moved since the
    batch planned) or :class:`CommitOutcomeUnknownError`. On success each table object
    holds its new metadata.
    """
    if isinstance(catalog, RestCatalog) and atomic_commits(catalog):
        if staged:
            commit_rest(catalog, staged)
        return
    if not isinstance(catalog, SqlCatalog) or not atomic_commits(catalog):
        raise SinkError(
            f"{type(catalog).__name__} cannot commit several tables in one transaction",
            hint="commit table by table (commit_staged)",
        )
    if not staged:
        return
    swaps: list[_Swap] = []
    session = Session(catalog.engine)
    try:
        for one in staged:
            swaps.append(_write_metadata(catalog, one))
        failpoint("before-catalog-swap")
        for swap in swaps:
            _swap_pointer(catalog, session, swap)
    except Exception as exc:  # nothing was sent for commit: the transaction rolls back
        session.rollback()
        session.close()
        _remove_staged(staged, swaps)
        if isinstance(exc, SparkapplyError):
            raise
        first = staged[0]
        raise SinkError(
            f"the catalog transaction failed before its commit: {type(exc).__name__}: {exc}",
            table=table_name(first.table),
            lsn=first.lsn,
            hint="nothing was committed; the batch is retried",
        ) from exc
    try:
        session.commit()
    except Exception as exc:
        session.close()
        _resolve(swaps, exc)
    else:
        session.close()
    failpoint("after-catalog-swap")
    for swap in swaps:
        table = swap.staged.table
        table.metadata = swap.metadata
        table.metadata_location = swap.metadata_location
    logger.debug("committed %d tables in one catalog transaction", len(swaps))


def _remove_staged(staged: Sequence[StagedSnapshot], swaps: Sequence[_Swap]) -> None:
    """The manifests and metadata files of a batch that did not commit."""
    for one in staged:
        delete_paths(one.table.io, one.delta.written)
    for swap in swaps:
        delete_paths(swap.staged.table.io, [swap.metadata_location])


def _write_metadata(catalog: SqlCatalog, staged: StagedSnapshot) -> _Swap:
    table = staged.table
    try:
        for requirement in staged.delta.requirements:
            requirement.validate(table.metadata)
    except CommitFailedException as exc:
        raise CommitConflictError(
            f"the table changed under the commit: {exc}",
            table=table_name(table),
            lsn=staged.lsn,
            hint="nothing was committed; re-load the table and re-plan the batch",
        ) from exc
    metadata = _updated(table, staged.delta.updates)
    version = catalog._parse_metadata_version(table.metadata_location) + 1
    provider = load_location_provider(metadata.location, metadata.properties)
    location = provider.new_table_metadata_file_location(version)
    METADATA_JSON.write(metadata, table.io, location)
    return _Swap(staged, metadata, location)


def _updated(table: Table, updates: Sequence[TableUpdate]) -> TableMetadata:
    """``updates`` applied to ``table``'s metadata as pyiceberg's
    ``update_table_metadata`` applies them (one context, the metadata log, the time of
    the change), but for its closing deep copy (see HOW). Each update already returns
    new metadata (``model_copy`` with new lists and maps), sharing only the parts it
    did not change, which nothing here or in pyiceberg changes in place."""
    base = table.metadata
    context = _TableMetadataUpdateContext()
    new = base
    for one in updates:
        new = _apply_table_update(one, new, context)
    if context.has_changes():
        new = _update_table_metadata_log(new, table.metadata_location, base.last_updated_ms)
        if new.last_updated_ms == base.last_updated_ms:
            now = datetime_to_millis(dt.datetime.now().astimezone())
            new = new.model_copy(update={"last_updated_ms": now})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


def _swap_pointer(catalog: SqlCatalog, session: Session, swap: _Swap) -> None:
    old = swap.staged.table.metadata_location
    ident = swap.staged.table.name()
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(ident))
    result = session.execute(
        update(IcebergTables)
        .where(
            IcebergTables.catalog_name == catalog.name,
            IcebergTables.table_namespace == namespace,
            IcebergTables.table_name == Catalog.table_name_from(ident),
            IcebergTables.metadata_location == old,
        )
        .values(metadata_location=swap.metadata_location, previous_metadata_location=old)
        # The session holds no catalog rows to bring up to date: evaluating the
        # WHERE clause against them was half of this function.
        .execution_options(synchronize_session=False)
    )
    if result.rowcount < 1:  # type: ignore[attr-defined]
        raise CommitConflictError(
            "the table was committed by another process since the batch was planned",
            table=table_name(swap.staged.table),
            lsn=swap.staged.lsn,
            hint="nothing of the batch was committed; re-load the tables and re-plan it",
        )


def _resolve(swaps: Sequence[_Swap], exc: Exception) -> None:
    """The transaction's commit failed in flight: it landed for every table or for
    none, so the first table tells. Return if it landed; raise otherwise."""
    first = swaps[0].staged
    resolve_unclear_outcome(first.table, first.snapshot_id, first.lsn, exc, landed=first.landed)
