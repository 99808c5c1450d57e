"""Named crash points for tests: the process kills itself (SIGKILL) when one is hit.

``SPARKAPPLY_TEST_FAILPOINT=name`` or ``name:N`` (the N-th hit) arms one point. Used
only by the crash-safety tests; a no-op otherwise (one dict lookup per call).
"""

from __future__ import annotations

import os
import signal

_ARMED = os.environ.get("SPARKAPPLY_TEST_FAILPOINT", "")
_NAME, _, _COUNT = _ARMED.partition(":")
_hits: dict[str, int] = {}


def failpoint(name: str) -> None:
    if not _NAME or name != _NAME:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(_COUNT or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def armed(name: str) -> bool:
    """Whether the test failpoint ``name`` is armed (a test may need its code path to
    run often enough to hit it)."""
    return name == _NAME
