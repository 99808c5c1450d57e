"""What staging keeps under ``work_dir``: the journal and the records. Driver side.

JOURNAL
    Before a piece writes, ``staging/<prefix><xid>.json`` names each table it stages:
    the table, its data directory and the prefix of the names of the files the piece
    writes there, so that a restart finds those files whatever point a crash stopped
    the piece at. The entry is removed once its transaction's batch is committed, its
    files are deleted, or a record keeps them.

RECORDS
    Once every piece of a STREAM PREPAREd transaction has finished,
    ``prepared/<xid>.staged.json`` (beside the prepared store's entry) lists the pieces
    with their files, for COMMIT PREPARED in this session or after a restart.

At start, a session sweeps what the journal names (:mod:`sparkapply.run.sweep`).

Both files are written whole (temp file, fsync, rename) but their directories are not
fsynced: an entry lost to a crash only leaves files for the orphan sweep, and a lost
record makes COMMIT PREPARED read the prepared spool.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkapply import location
from sparkapply.apply.write.parquet import filesystem
from sparkapply.staging.piece import StagedFiles, StageResult, StageTask
from sparkapply.state.durable import write_json_durably
from sparkapply.state.layout import (
    is_journal_entry,
    journal_entry,
    prepared_dir,
    staged_records,
    staging_dir,
)

log = logging.getLogger(__name__)


# -- the journal ----------------------------------------------------------------------------


def write_journal(journal_dir: Path, task: StageTask) -> str:
    """Before the piece writes: where its files will be. Returns the entry's path."""
    journal_dir.mkdir(parents=True, exist_ok=True)
    path = journal_entry(journal_dir, task.tables[0].prefix, task.xid)
    entries = [{"table": t.name, "dir": t.data_dir, "prefix": t.prefix} for t in task.tables]
    write_json_durably(path, {"xid": task.xid, "tables": entries}, sync_dir=False)
    return str(path)


def forget_journal(result: StageResult) -> None:
    """The piece's files are committed, deleted or recorded: drop its journal entry."""
    if result.journal is not None:
        Path(result.journal).unlink(missing_ok=True)
        result.journal = None


def journalled(root: Path) -> tuple[list[Path], list[tuple[str, str, str]]]:
    """The journal under ``root``: every entry (to remove), and (table, data
    directory, file-name prefix) of each table the complete ones name. An entry half
    written (its piece had not started) is skipped; one gone meanwhile (its piece's
    files committed, deleted or recorded) too; one unreadable is logged."""
    entries = sorted(root.iterdir()) if root.is_dir() else []
    tables: list[tuple[str, str, str]] = []
    for entry in entries:
        if not is_journal_entry(entry):
            continue
        try:
            tables.extend(read_journal(entry))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError) as exc:
            log.warning("cannot read the staging journal %s: %s", entry, exc)
    return entries, tables


def read_journal(entry: Path) -> Iterator[tuple[str, str, str]]:
    """(table, data directory, file-name prefix) of each table a journal entry names;
    OSError, ValueError or KeyError when it cannot be read."""
    doc = json.loads(entry.read_text())
    for t in doc["tables"]:
        yield t["table"], t["dir"], t["prefix"]


# -- the records of prepared transactions -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedPiece:
    """A finished piece of a prepared transaction, as its record keeps it."""

    start: int
    end: int
    touched: frozenset[int]
    covered: frozenset[int]
    tables: tuple[StagedFiles, ...]


def write_record(path: Path, xid: int, pieces: Sequence[RecordedPiece]) -> None:
    doc = {
        "xid": xid,
        "pieces": [
            {
                "start": p.start,
                "end": p.end,
                "touched": sorted(p.touched),
                "covered": sorted(p.covered),
                "tables": [dataclasses.asdict(t) for t in p.tables],
            }
            for p in pieces
        ],
    }
    write_json_durably(path, doc, sync_dir=False)


def read_record(path: Path) -> list[RecordedPiece] | None:
    """The pieces a record lists; None when there is none, or it is unreadable."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the unreadable staging record %s: %s", path, exc)
        return None
    return [
        RecordedPiece(
            raw["start"],
            raw["end"],
            frozenset(raw["touched"]),
            frozenset(raw["covered"]),
            tuple(StagedFiles(**t) for t in raw["tables"]),
        )
        for raw in doc["pieces"]
    ]


def waiting_files(work_dir: Path) -> set[str]:
    """Every file staged for a prepared transaction that waits for COMMIT PREPARED: no
    snapshot references it yet, and none of the sweeps may delete it."""
    return {
        f
        for record in staged_records(prepared_dir(work_dir))
        for piece in (read_record(record) or [])
        for t in piece.tables
        for f in t.written()
    }


def kept_by_staging(work_dir: Path) -> set[str]:
    """What no orphan sweep may delete, as name prefixes (a file's own name is one):
    the files staged for prepared transactions (:func:`waiting_files`), and every
    file a journalled piece writes or wrote, which a streamed transaction's commit
    will reference however long it is in coming. The journal is emptied at start,
    so these are the live session's pieces (or a killed one's, until the next
    start sweeps them)."""
    _, tables = journalled(staging_dir(work_dir))
    return waiting_files(work_dir) | {location.join(d, prefix) for _, d, prefix in tables}


def delete_files(uris: Sequence[str]) -> None:
    """Delete staged data files; one already gone is fine, one that cannot be is left
    to the orphan sweep."""
    for uri in uris:
        fs, path = filesystem(uri)
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # an orphan wastes space; the orphan sweep removes it
            log.warning("cannot delete the staged file %s: %s", uri, exc)
