"""A streamed transaction that updates a keyed table, staged in pieces netted by key
(``staging/piece.py``) and composed at commit (``apply/fold/staged.py``): the same
table as a plain model of the changes, or, when a key is put by one piece and
replaced by a later one, ``unstaged`` and nothing written. No Spark: the piece and
the table task run in this process, on files in a temporary directory."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.apply.fold.keyed import NetEffect
from sparkapply.apply.fold.rowwise import TxnInput
from sparkapply.apply.fold.staged import composed_removes
from sparkapply.apply.job import merge_results
from sparkapply.apply.tasks import TableTask, run_table_task
from sparkapply.apply.write.parquet import TableWriter
from sparkapply.changes.spool import SpoolSegment, SpoolWriter
from sparkapply.changes.staged import PieceFiles
from sparkapply.datafiles import DataFileInfo
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m
from sparkapply.staging.piece import StageTable, StageTask, run_stage_task
from sparkapply.storage import Storage
from tests.apply.test_keyfold import (
    SCHEMA,
    V1,
    Row,
    expected_rows,
    key_tup,
    prebatch_file,
    result_rows,
    tup,
)

KEY = ("id",)


def _segments(
    rnd: random.Random, n: int, prebatch: dict[int, Row], conflict: str | None
) -> tuple[list[list[m.Message]], dict[int, Row]]:
    """``n`` segments of one transaction, each changing its own keys once (updates,
    deletes, key moves, inserts), and a delete then re-insert of one key across two
    segments (that composes); with ``conflict``, one key is put by a segment and
    replaced by a later one. Returns the segments' messages and the model's rows."""
    state = {k: dict(v) for k, v in prebatch.items()}
    pools = [sorted(prebatch)[i::n] for i in range(n)]  # each segment's pre-batch keys
    segments: list[list[m.Message]] = [[] for _ in range(n)]
    fresh = iter(range(5000 + 100 * rnd.randint(0, 9), 10_000))
    for i, pool in enumerate(pools):
        out = segments[i]
        for key in pool:
            op = rnd.random()
            if op < 0.4:
                row = {**state[key], "qty": rnd.randint(10, 99), "name": f"u{i}"}
                state[key] = row
                out.append(m.Update(None, 7, None, None, tup(row, 3)))
            elif op < 0.55:
                del state[key]
                out.append(m.Delete(None, 7, "K", key_tup(key, 3)))
            elif op < 0.65:
                new = next(fresh)
                row = {**state.pop(key), "id": new}
                state[new] = row
                out.append(m.Update(None, 7, "K", key_tup(key, 3), tup(row, 3)))
        for _ in range(rnd.randint(0, 5)):
            new = next(fresh)
            state[new] = {"id": new, "name": f"i{i}", "qty": i}
            out.append(m.Insert(None, 7, tup(state[new], 3)))
    # Deleted in the first segment, inserted again in the last: composes.
    back = pools[0][-1]
    if back in state:
        del state[back]
        segments[0].append(m.Delete(None, 7, "K", key_tup(back, 3)))
    state[back] = {"id": back, "name": "back", "qty": 1}
    segments[-1].append(m.Insert(None, 7, tup(state[back], 3)))
    if conflict is not None:
        first, later = (0, n - 1) if conflict == "in the remainder" else (0, 1)
        put = next(fresh)
        state[put] = {"id": put, "name": "put", "qty": 2}
        segments[first].append(m.Insert(None, 7, tup(state[put], 3)))
        if conflict == "deleted later":
            del state[put]
            segments[later].append(m.Delete(None, 7, "K", key_tup(put, 3)))
        else:
            state[put] = {**state[put], "qty": 3}
            segments[later].append(m.Update(None, 7, None, None, tup(state[put], 3)))
    return segments, state


def _spool(tmp_path: Path, segments: list[list[m.Message]]) -> list[SpoolSegment]:
    w = SpoolWriter(tmp_path / "txn.spool")
    w.append(encode(V1), False)
    out = []
    start = 0
    for msgs in segments:
        for msg in msgs:
            w.append(encode(msg), False)
        w.flush()
        out.append(SpoolSegment(str(w.path), start, w.offset))
        start = w.offset
    return out


def _stage(tmp_path: Path, segment: SpoolSegment) -> PieceFiles:
    table = StageTable(
        "public.t", frozenset({7}), SCHEMA, 0, str(tmp_path / "data"), key_names=KEY, mutated=True
    )
    result = run_stage_task(
        StageTask(812, segment, (V1,), (table,), 4, "parallel", storage=Storage())
    )
    assert result.error is None
    (staged,) = result.tables
    assert staged.keyed and not staged.mutated
    return tuple(staged.files), staged.removes


@pytest.mark.parametrize("tasks", [1, 3])
@pytest.mark.parametrize("conflict", [None, "updated later", "deleted later", "in the remainder"])
@pytest.mark.parametrize("seed", range(6))
def test_staged_pieces_compose_to_the_model(
    seed: int, conflict: str | None, tasks: int, tmp_path: Path
) -> None:
    rnd = random.Random(seed)
    prebatch: dict[int, Row] = {
        k: {"id": k, "name": f"pre {k}", "qty": k % 7}
        for k in sorted(rnd.sample(range(1, 900), 120))
    }
    n = rnd.randint(2, 5)
    segments, state = _segments(rnd, n, prebatch, conflict)
    spooled = _spool(tmp_path, segments)
    pieces = tuple(_stage(tmp_path, s) for s in spooled[:-1])
    pre_path, pre_deleted = prebatch_file(tmp_path, prebatch)
    old_deletes = TableWriter(str(tmp_path / "setup"), SCHEMA).write_deletes(
        {pre_path: pre_deleted}
    )
    assert old_deletes is not None
    task = TableTask(
        table="public.t",
        relation_ids=frozenset({7}),
        key_names=KEY,
        txns=(TxnInput(0, 812, 1000, (spooled[-1],), (V1,)),),
        schema=SCHEMA,
        data_files=(DataFileInfo(pre_path, 2 * len(prebatch), 0, min(prebatch), max(prebatch)),),
        delete_files=(old_deletes,),
        data_dir=str(tmp_path / "data"),
        proto_version=4,
        streaming="parallel",
        staged=pieces,
        storage=Storage(),
    )
    # Split by key over several tasks, as the job splits a big table (job.py).
    parts = [run_table_task(dataclasses.replace(task, partition=(i, tasks))) for i in range(tasks)]
    assert all(p.error is None and p.path == "staged-keyed" for p in parts)
    (result,) = merge_results(parts)
    if conflict is not None:
        # The driver removes what the composing partitions wrote; the one that found
        # the conflict wrote nothing.
        assert result.unstaged
        assert any(p.unstaged and not p.added and not p.deletes for p in parts)
        return
    assert not result.unstaged
    staged_files = [f for files, _ in pieces for f in files]
    got = result_rows(
        tmp_path,
        pre_path,
        pre_deleted,
        [*staged_files, *result.added],
        [d.path for d in result.deletes],
    )
    assert got == expected_rows(state)
    assert result.n_changes == len(segments[-1])  # the remainder's; the pieces count theirs
    if tasks > 1:  # each row removed and written once, as by one task
        one = run_table_task(task)
        assert (result.rows_removed, result.rows_written) == (one.rows_removed, one.rows_written)


def test_a_piece_that_truncates_or_has_no_key_stages_nothing(tmp_path: Path) -> None:
    w = SpoolWriter(tmp_path / "t.spool")
    w.append(encode(V1), False)
    w.append(encode(m.Update(None, 7, None, None, tup({"id": 1, "name": "a", "qty": 1}, 3))), False)
    w.append(encode(m.Truncate(None, 0, (7,))), False)
    w.flush()
    segment = SpoolSegment(str(w.path), 0, w.offset)
    for keys in (KEY, ()):
        table = StageTable(
            "public.t", frozenset({7}), SCHEMA, 0, str(tmp_path / "d"), key_names=keys, mutated=True
        )
        result = run_stage_task(
            StageTask(5, segment, (V1,), (table,), 4, "parallel", storage=Storage())
        )
        assert result.error is None
        (staged,) = result.tables
        assert staged.mutated and not staged.written()
    assert not list((tmp_path / "d").glob("*.parquet"))


def _keys(*values: int) -> list[pa.Array]:
    return [pa.array(values, pa.int64())]


def test_composition_on_values(tmp_path: Path) -> None:
    """Removes of every piece are located together; a put followed by a later removal
    of the same key is refused, a removal followed by a later put is not."""

    def piece(name: str, puts: tuple[int, ...], removes: tuple[int, ...]) -> PieceFiles:
        data = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"id": pa.array(puts, pa.int64())}), data)
        gone = None
        if removes:
            gone = str(tmp_path / f"{name}-keys.parquet")
            pq.write_table(pa.table({"id": pa.array(removes, pa.int64())}), gone)
        return (str(data),), gone

    def rest(puts: tuple[int, ...], removes: tuple[int, ...]) -> NetEffect:
        return NetEffect(
            pa.table({"id": pa.array(puts, pa.int64())}), _keys(*removes) if removes else []
        )

    ok = composed_removes(
        [piece("a", (1, 2), (1, 2, 5)), piece("b", (3, 5), (3,))], rest((), (4,)), KEY
    )
    assert ok is not None and sorted(ok[0].to_pylist()) == [1, 2, 3, 4, 5]
    assert composed_removes([piece("c", (1,), ()), piece("d", (), (1,))], rest((), ()), KEY) is None
    assert composed_removes([piece("e", (7,), (7,))], rest((7,), (7,)), KEY) is None
    assert composed_removes([piece("f", (), (8,))], rest((8,), ()), KEY) == _keys(8)


@pytest.mark.parametrize("seed", range(20))
def test_integer_keys_compose_as_any_keys_do(seed: int) -> None:
    """One integer key is checked in NumPy, any other key by a hash group-by: on the
    same pieces both say the same, crossings or not (text keys take the other path)."""
    from sparkapply.apply.fold.staged import _compose

    rnd = random.Random(seed)
    n = rnd.randint(1, 6)

    def keys() -> list[int]:
        return rnd.sample(range(200), rnd.randint(0, 40))

    puts = [keys() for _ in range(n)]
    removes = [keys() for _ in range(n)]
    truth = not any(k in removes[j] for i in range(n) for j in range(i + 1, n) for k in puts[i])

    def cols(groups: list[list[int]], type_: pa.DataType) -> list[list[pa.Array]]:
        return [[pa.array(g, pa.int64()).cast(type_)] for g in groups]

    for type_ in (pa.int64(), pa.int32(), pa.string()):
        assert _compose(cols(puts, type_), cols(removes, type_), ["id"]) is truth, type_
