"""The metrics endpoint: served on loopback, over HTTP, per subscriber; a busy port is
a configuration error."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from sparkapply.config import MetricsConfig
from sparkapply.errors import ConfigError, ErrorKind
from sparkapply.metrics import Metrics


def test_off_by_default(tmp_path: Path) -> None:
    metrics = Metrics(MetricsConfig(), tmp_path)
    assert metrics.serve() is None and metrics.port is None
    metrics.close()


def test_served_on_loopback_and_spool_read_at_scrape(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "txns-0.spool").write_bytes(b"x" * 1234)
    metrics = Metrics(MetricsConfig(port=0), tmp_path)
    port = metrics.serve()
    try:
        assert port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert "sparkapply_spool_bytes 1234.0" in text
        assert "sparkapply_prepared_pending 0.0" in text
        # Bound to 127.0.0.1 only.
        host = socket.gethostbyname(socket.gethostname())
        if not host.startswith("127."):
            with pytest.raises(OSError):
                socket.create_connection((host, port), timeout=2).close()
        two = Metrics(MetricsConfig(port=port), tmp_path)
        with pytest.raises(ConfigError, match="cannot serve metrics") as info:
            two.serve()
        assert info.value.context["key"] == "metrics.port"
        assert info.value.kind is ErrorKind.OPERATOR
    finally:
        metrics.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
