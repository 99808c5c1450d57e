"""When the apply may use staged files (StagedWork.use), and the journal sweep: no Spark."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa
import pytest

from sparkapply.changes.spool import SpoolSegment
from sparkapply.errors import SparkapplyError
from sparkapply.pgoutput import messages as m
from sparkapply.staging.piece import StagedFiles, StageResult
from sparkapply.staging.stager import Piece, StagedWork

REL = m.Relation(None, 7, "public", "t", "d", (m.RelationColumn(1, "id", 23, -1),))


def _piece(
    start: int, end: int, *tables: StagedFiles, touched: set[int], covered: set[int]
) -> Piece:
    fut: Future[StageResult] = Future()
    fut.set_result(StageResult(tables=list(tables)))
    return Piece(SpoolSegment("/spool", start, end), fut, frozenset(touched), frozenset(covered))


def _work(*pieces: Piece, end: int = 300) -> StagedWork:
    return StagedWork(11, "/spool", end, list(pieces), lambda offset: (REL,))


def _files(table: str = "public.t", *names: str, schema_id: int = 0) -> StagedFiles:
    return StagedFiles(table, schema_id, list(names), rows=10 * len(names), changes=10 * len(names))


def test_pieces_that_staged_the_table_give_their_files_and_the_remainder() -> None:
    work = _work(
        _piece(0, 100, _files("public.t", "a"), touched={7}, covered={7}),
        _piece(100, 200, _files("public.t", "b"), touched={7}, covered={7}),
    )
    use = work.use("public.t", frozenset({7}), 0)
    assert use is not None
    assert use.files == ("a", "b") and use.rows == 20 and use.changes == 20
    assert use.remainder == (SpoolSegment("/spool", 200, 300),)
    assert use.relations == (REL,)


def test_nothing_left_to_read_when_the_last_piece_ends_at_the_commit() -> None:
    work = _work(_piece(0, 300, _files("public.t", "a"), touched={7}, covered={7}))
    use = work.use("public.t", frozenset({7}), 0)
    assert use is not None and use.remainder == ()


@pytest.mark.parametrize(
    "why",
    ["mutated", "schema changed", "not covered", "failed"],
)
def test_staged_files_are_not_used(why: str) -> None:
    staged = _files("public.t", "a")
    covered = {7}
    if why == "mutated":
        staged = StagedFiles("public.t", 0, [], mutated=True)
    if why == "not covered":  # the table did not exist when the first piece was staged
        covered = set()
    first = _piece(0, 100, staged, touched={7}, covered=covered)
    if why == "failed":
        fut: Future[StageResult] = Future()
        fut.set_result(StageResult(error=SparkapplyError("executor lost")))
        first = Piece(first.segment, fut, first.touched, first.covered)
    work = _work(first, _piece(100, 200, _files("public.t", "b"), touched={7}, covered={7}))
    assert work.use("public.t", frozenset({7}), 1 if why == "schema changed" else 0) is None


def test_keyed_pieces_are_used_only_when_the_apply_composes_them() -> None:
    keyed = StagedFiles("public.t", 0, ["b"], rows=5, changes=9, keyed=True, removes="b-keys")
    work = _work(
        _piece(0, 100, _files("public.t", "a"), touched={7}, covered={7}),
        _piece(100, 200, keyed, touched={7}, covered={7}),
    )
    assert work.use("public.t", frozenset({7}), 0) is None  # the batch only appends
    use = work.use("public.t", frozenset({7}), 0, keyed=True)
    assert use is not None
    assert use.keyed == ((("a",), None), (("b",), "b-keys"))  # in order, inserts too
    assert use.files == ("a", "b") and use.changes == 19
    assert use.remainder == (SpoolSegment("/spool", 200, 300),)
    # Only inserting pieces, asked for keyed: still composed (the rest may update).
    plain = _work(_piece(0, 100, _files("public.t", "a"), touched={7}, covered={7}))
    composed, appended = (plain.use("public.t", frozenset({7}), 0, keyed=k) for k in (True, False))
    assert composed is not None and composed.keyed == ((("a",), None),)
    assert appended is not None and appended.keyed == ()


def test_a_table_first_touched_in_a_later_piece_uses_only_that_piece() -> None:
    other = _files("public.u", "u1")
    work = _work(
        _piece(0, 100, other, touched={8}, covered={8}),
        _piece(
            100,
            200,
            _files("public.u", "u2"),
            _files("public.t", "t1"),
            touched={7, 8},
            covered={7, 8},
        ),
    )
    use = work.use("public.t", frozenset({7}), 0)
    assert use is not None and use.files == ("t1",)


def test_finish_deletes_what_was_not_used(tmp_path: Path) -> None:
    used, unused = tmp_path / "used.parquet", tmp_path / "unused.parquet"
    for f in (used, unused):
        f.write_bytes(b"x")
    journal = tmp_path / "piece.json"
    journal.write_text("{}")
    removes = tmp_path / "removes-keys.parquet"  # a keyed piece's: never committed
    removes.write_bytes(b"x")
    staged = _files("public.t", str(used), str(unused))
    staged.removes = str(removes)
    result = StageResult(tables=[staged], journal=str(journal))
    fut: Future[StageResult] = Future()
    fut.set_result(result)
    work = _work(Piece(SpoolSegment("/spool", 0, 100), fut, frozenset({7}), frozenset({7})))
    work.finish({str(used)})
    assert used.exists() and not unused.exists() and not journal.exists()
    assert not removes.exists()


def test_arrow_is_importable_for_the_stage_task() -> None:
    # StageTable carries an Arrow schema to executors: it must pickle.
    import pickle

    from sparkapply.staging.piece import StageTable

    t = StageTable("public.t", frozenset({7}), pa.schema([("id", pa.int32())]), 0, "/d")
    assert pickle.loads(pickle.dumps(t)) == t
