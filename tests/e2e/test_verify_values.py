"""verify through a real mirror of every mapped type, with nulls and special values in
every column and every array position (``tests/verify/values.py``): it matches the
mirror the product wrote (copied, streamed by a Spark job, applied by verify's own
run on the driver), and finds each single value changed behind the mirror's back,
naming its row's key and column. The same, smaller, runs on PostgreSQL 15, 17 and 18
(``test_versions.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from psycopg import sql

from sparkapply.cli import main
from tests.mirror import Mirror
from tests.verify.values import COLUMNS, TYPES_SQL, Column, rows


def _create(name: str, columns: Sequence[Column], *, keyed: bool) -> str:
    cols = ", ".join(f"{c} {t}" for c, t, _ in columns)
    if keyed:
        return f"CREATE TABLE {name} (id int PRIMARY KEY, {cols})"
    return f"CREATE TABLE {name} ({cols}); ALTER TABLE {name} REPLICA IDENTITY FULL"


def _inserts(
    name: str,
    columns: Sequence[Column],
    values: Sequence[Sequence[str | None]],
    *,
    keyed: bool,
    first: int = 0,
) -> list[str]:
    out = []
    for r, row in enumerate(values, start=first):
        cells = [
            "NULL" if v is None else sql.Literal(v).as_string() + f"::{t}"
            for v, (_, t, _) in zip(row, columns, strict=True)
        ]
        out.append(f"INSERT INTO {name} VALUES ({', '.join(([str(r)] if keyed else []) + cells)})")
    return out


def build(mirror: Mirror, columns: Sequence[Column], count: int) -> int:
    """A keyed table ``k`` of ``count`` rows (or more) and a keyless one ``f`` over
    ``columns``: half copied, half streamed and applied by a Spark job, then changes
    left for verify's own run. The id of ``k``'s last row, deleted: the rows below it
    remain."""
    keyed = rows(columns, count)
    keyless = rows(columns)
    half, half_f = len(keyed) // 2, len(keyless) // 2
    mirror.sql(
        *TYPES_SQL,
        _create("k", columns, keyed=True),
        _create("f", columns, keyed=False),
        *_inserts("k", columns, keyed[:half], keyed=True),
        *_inserts("f", columns, keyless[:half_f], keyed=False),
        "CREATE PUBLICATION pub FOR TABLE k, f",
    )
    mirror.run()  # copied
    mirror.sql(
        *_inserts("k", columns, keyed[half:], keyed=True, first=half),
        *_inserts("f", columns, keyless[half_f:], keyed=False),
    )
    mirror.run()  # streamed
    # For verify's own run: an update that leaves TOASTed values unchanged (pgoutput
    # does not send them), and a delete.
    mirror.sql(
        "UPDATE k SET id = id WHERE id % 2 = 0", f"DELETE FROM k WHERE id = {len(keyed) - 1}"
    )
    return len(keyed) - 1


def _changed(column: pa.Array, at: int, *, to_null: bool) -> pa.Array:
    """``column`` with the value at ``at`` replaced: by null, or by another row's
    value that differs from it (when there is none, by null; a null by a value)."""
    here = column[at]
    replacement = pa.nulls(1, column.type)
    if not here.is_valid or not to_null:
        for other in range(len(column)):
            candidate = column[other]
            if candidate.is_valid and repr(candidate.as_py()) != repr(here.as_py()):
                replacement = column.slice(other, 1)
                break
    return pa.concat_arrays([column.slice(0, at), replacement, column.slice(at + 1)])


def plant(mirror: Mirror, changes: Sequence[tuple[int, str]]) -> dict[str, str]:
    """Change one value in Iceberg in each row of ``k`` named, in the column named (one
    commit); ``{key: column}``."""
    table = mirror.iceberg_table("public.k")
    arrow = table.scan().to_arrow().sort_by("id")
    ids = arrow.column("id").to_pylist()
    for n, (key, name) in enumerate(changes):
        column = arrow.column(name).combine_chunks()
        changed = _changed(column, ids.index(key), to_null=n % 2 == 1)
        arrow = arrow.set_column(arrow.schema.get_field_index(name), name, changed)
    table.overwrite(arrow)
    return {f"id='{key}'": name for key, name in changes}


def verify(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["verify", "--config", str(config), "--json", "--max-rows", "1000"])
    return code, json.loads(capsys.readouterr().out)


def prove(
    mirror: Mirror,
    config: Path,
    columns: Sequence[Column],
    capsys: pytest.CaptureFixture[str],
    *,
    count: int,
) -> None:
    """Verify matches the mirror; then finds one value changed in one row; then, with
    that one, one changed in each of ``count`` more rows, each in another column."""
    last = build(mirror, columns, count)
    code, report = verify(config, capsys)
    assert code == 0, report
    assert sorted(t["table"] for t in report["tables"]) == ["public.f", "public.k"]
    names = [c for c, _, _ in columns]
    planted: dict[str, str] = {}
    for changes in ([(last - 1, "ts")], [(n, names[n % len(names)]) for n in range(last - 1)]):
        planted |= plant(mirror, changes[:count])
        code, report = verify(config, capsys)
        assert code == 1
        k = next(t for t in report["tables"] if t["table"] == "public.k")
        found = {d["row"]: d["columns"] for d in k["differences"]}
        assert found == {key: [name] for key, name in planted.items()}, report
        assert {d["kind"] for d in k["differences"]} == {"different"}
        assert k["differing"] == len(planted)
        f = next(t for t in report["tables"] if t["table"] == "public.f")
        assert f["match"], f


def test_verify_proves_every_mapped_type(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = mirror.write_config(tmp_path / "verify.toml")
    prove(mirror, config, COLUMNS, capsys, count=len(COLUMNS) + 2)
