"""The test harness's iceberg-rust reader: its own process, killed and replaced when a
read blocks (see :mod:`tests.rust_reader`)."""

from __future__ import annotations

import os
import signal
import subprocess

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from tests.reader_process import ReaderTimeout
from tests.rust_reader import RustReader


def _table(catalog: Catalog) -> Table:
    catalog.create_namespace_if_not_exists("public")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "note", StringType()),
    )
    table = catalog.create_table(("public", "notes"), schema)
    table.append(
        pa.table(
            {"id": pa.array([1, 2, 3], pa.int64()), "note": ["a", None, "c"]},
            schema=pa.schema([pa.field("id", pa.int64(), False), pa.field("note", pa.string())]),
        )
    )
    return table


def test_a_blocked_read_kills_the_reader_and_is_tried_again(catalog: Catalog) -> None:
    table = _table(catalog)
    reader = RustReader(seconds=5.0)
    try:
        first = reader.read(table)
        assert sorted(first.column("id").to_pylist()) == [1, 2, 3]
        blocked = reader.pid
        assert blocked is not None
        os.kill(blocked, signal.SIGSTOP)  # as a read blocked in iceberg-rust would
        again = reader.read(table, ["note", "id"])
        assert again.column_names == ["note", "id"]
        assert sorted(again.to_pylist(), key=lambda r: r["id"]) == [
            {"note": "a", "id": 1},
            {"note": None, "id": 2},
            {"note": "c", "id": 3},
        ]
        assert reader.pid not in (None, blocked)
        with pytest.raises(ProcessLookupError):
            os.kill(blocked, 0)  # killed and reaped
    finally:
        reader.close()


def test_a_stopped_reader_times_out_on_the_second_try_too(catalog: Catalog) -> None:
    """No endless retrying: a reader that blocks twice fails the read."""
    table = _table(catalog)
    reader = RustReader(seconds=2.0)
    try:
        reader.read(table)
        first = reader.pid
        assert first is not None
        os.kill(first, signal.SIGSTOP)
        # Block the replacement too, as soon as it exists: stop every child the reader
        # starts by wrapping its start.
        started = reader._started

        def stopped_start() -> subprocess.Popen[bytes]:
            child = started()
            os.kill(child.pid, signal.SIGSTOP)
            return child

        reader._started = stopped_start  # type: ignore[method-assign]
        with pytest.raises(ReaderTimeout):
            reader.read(table)
        assert reader.pid is None  # the blocked replacement is killed too
    finally:
        reader.close()
