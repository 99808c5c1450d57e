"""The fold path is chosen in one place (``choose_path``), and a vectorised fold that
cannot net what it meets hands the task to the row-wise fold."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkapply.apply.fold.path import FoldPath, choose_path
from sparkapply.apply.tasks import TableResult, TableTask, run_table_task
from sparkapply.pgoutput import messages as m
from sparkapply.plan.batch import Identity
from sparkapply.storage import Storage
from tests.apply.test_fold_identity import spool


def task(
    tmp_path: Path, *, identity: Identity = "key", insert_only: bool = False, **kw: object
) -> TableTask:
    fields = {
        "txns": (),
        "key_names": ("a",),
        "schema": pa.schema([pa.field("a", pa.int32()), pa.field("b", pa.int32())]),
    }
    fields.update(kw)
    return TableTask(
        table="public.t",
        relation_ids=frozenset({7}),
        data_files=(),
        delete_files=(),
        data_dir=str(tmp_path / "d"),
        proto_version=4,
        streaming="parallel",
        identity=identity,
        insert_only=insert_only,
        storage=Storage(),
        **fields,
    )


@pytest.mark.parametrize(
    ("identity", "insert_only", "path"),
    [
        ("key", True, FoldPath.INSERT_ONLY),
        ("none", True, FoldPath.INSERT_ONLY),
        ("key", False, FoldPath.KEYED),
        ("full", False, FoldPath.FULL),
        ("mixed", False, FoldPath.ROW_WISE),
        ("none", False, FoldPath.ROW_WISE),
    ],
)
def test_one_function_chooses_the_path(
    tmp_path: Path, identity: Identity, insert_only: bool, path: FoldPath
) -> None:
    assert choose_path(task(tmp_path, identity=identity, insert_only=insert_only)) is path


def test_staged_pieces_take_their_own_path(tmp_path: Path) -> None:
    staged = task(tmp_path, staged=(((str(tmp_path / "a.parquet"),), None),))
    assert choose_path(staged) is FoldPath.STAGED_KEYED


def test_what_the_keyed_fold_cannot_net_is_applied_row_wise(tmp_path: Path) -> None:
    """An array key: the keyed fold says it cannot, the row-wise fold applies it."""
    cols = (m.RelationColumn(1, "a", 1007, -1), m.RelationColumn(0, "b", 23, -1))
    rel = m.Relation(None, 7, "public", "t", "d", cols)

    def row(a: str, b: int) -> m.TupleData:
        return m.TupleData(b"tt", (a.encode(), str(b).encode()))

    txn = spool(
        tmp_path,
        rel,
        m.Insert(None, 7, row("{1,2}", 1)),
        m.Insert(None, 7, row("{3}", 2)),
        m.Update(None, 7, None, None, row("{3}", 5)),
    )
    schema = pa.schema([pa.field("a", pa.list_(pa.int32())), pa.field("b", pa.int32())])
    t = task(tmp_path, txns=(txn,), schema=schema)
    assert choose_path(t) is FoldPath.KEYED
    result = run_table_task(t)
    assert result.error is None
    assert result.path == "row-wise"
    assert result.n_changes == 3
    rows = pa.concat_tables([pq.read_table(p) for p in result.added]).to_pylist()
    assert sorted(rows, key=lambda r: r["b"]) == [{"a": [1, 2], "b": 1}, {"a": [3], "b": 5}]
    assert {"fold", "locate", "write"} <= set(result.timings)


def test_a_small_batch_is_folded_on_the_driver_and_a_bigger_one_is_not(tmp_path: Path) -> None:
    """Under ``driver_fold_bytes`` of spool in all, the tasks run here, one after
    another, with the executors' code: no Spark job (the session is not touched)."""
    from sparkapply.apply.job import on_driver, run_tasks, task_bytes

    txn = spool(
        tmp_path,
        m.Relation(None, 7, "public", "t", "d", (m.RelationColumn(1, "a", 23, -1),)),
        m.Insert(None, 7, m.TupleData(b"t", (b"5",))),
    )
    schema = pa.schema([pa.field("a", pa.int32())])
    t = task(tmp_path, txns=(txn,), schema=schema, insert_only=True)
    (result,) = run_tasks(None, [t], driver_fold_bytes=task_bytes(t))  # type: ignore[arg-type]
    assert result.error is None and result.tasks == 0 and result.path == "insert-only"
    assert pa.concat_tables([pq.read_table(p) for p in result.added]).to_pylist() == [{"a": 5}]

    class NoSpark:  # a bigger batch is a Spark job
        @property
        def sparkContext(self) -> object:
            raise RuntimeError("a Spark job")

    with pytest.raises(RuntimeError, match="a Spark job"):
        run_tasks(NoSpark(), [t], driver_fold_bytes=task_bytes(t) - 1)  # type: ignore[arg-type]
    # Staged pieces to compose: a Spark job however small the spool left after them
    # (their keys are the work: a million of them for a 1,000,000-row update).
    staged = dataclasses.replace(t, insert_only=False, staged=((("piece.parquet",), None),))
    assert on_driver([t], task_bytes(t)) and not on_driver([staged], 1 << 40)
    with pytest.raises(RuntimeError, match="a Spark job"):
        run_tasks(NoSpark(), [staged], driver_fold_bytes=1 << 40)  # type: ignore[arg-type]


def test_the_daemons_warm_up_runs_both_paths_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker daemon runs it before forking: a failure there would only cost the
    head start, so it must not fail silently in the tests."""
    from sparkapply.apply import warm

    seen: list[TableResult] = []

    def spy(task: TableTask) -> TableResult:
        seen.append(run_table_task(task))
        return seen[-1]

    monkeypatch.setattr(warm, "run_table_task", spy)
    warm.warm_up()
    assert [r.path for r in seen] == ["keyed", "insert-only"]
    assert all(r.error is None for r in seen)
    assert seen[1].rows_written == 1
