"""When maintenance beside the apply runs (maintain/background.py): pure scheduling,
on a recording stand-in for the maintainer and a clock the test moves."""

from __future__ import annotations

from typing import Any

from sparkapply.maintain.background import MIN_SECONDS_BETWEEN_RUNS, BackgroundMaintenance


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def run_due(self, tables: Any) -> list[Any]:
        self.calls.append(("run_due", tuple(tables)))
        return []

    def expire_excess(self, ident: Any, *, retain_last: int) -> None:
        self.calls.append(("expire", (ident, retain_last)))


def test_runs_are_paced_but_the_applys_expiry_is_not_held_back() -> None:
    now = [100.0]
    rec = Recorder()
    bg = BackgroundMaintenance(
        rec,  # type: ignore[arg-type]
        lambda: [("public", "t")],
        retain_snapshots=7,
        clock=lambda: now[0],
    )
    try:
        bg.poke()  # the first run starts at once
        bg.close_run()
        assert rec.calls == [("run_due", (("public", "t"),))]
        now[0] += 1
        bg.poke()  # too soon: nothing
        bg.close_run()
        assert len(rec.calls) == 1
        bg.expire_later(("public", "t"))
        bg.poke()  # an expiry the apply asked for runs at once, then the rest
        bg.close_run()
        assert rec.calls[1:] == [("expire", (("public", "t"), 7)), ("run_due", (("public", "t"),))]
        now[0] += MIN_SECONDS_BETWEEN_RUNS
        bg.poke()
        bg.close_run()
        assert len(rec.calls) == 4
    finally:
        bg.close()
