"""The benchmarks' library is imported as the scripts import it: from ``bench/``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
