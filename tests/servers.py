"""A PostgreSQL server of a test's own, beside the run's shared one (tests/conftest.py):
for a setting the shared server must not have, or another major version."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from sparkapply.embedded import EmbeddedPostgres


@contextlib.contextmanager
def own_server(
    prefix: str, settings: Mapping[str, str], bin_dir: Path | None = None
) -> Iterator[EmbeddedPostgres]:
    """A server started with ``settings`` (from ``bin_dir``, else the bundled one),
    stopped and removed when the block ends."""
    root = Path(tempfile.mkdtemp(prefix=f"sparkapply-test-{prefix}-"))
    os.chmod(root, 0o755)  # the server may run as another user (see sparkapply.embedded)
    pg = EmbeddedPostgres(root / "data", settings=settings, bin_dir=bin_dir)
    pg.start()
    try:
        yield pg
    finally:
        pg.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
