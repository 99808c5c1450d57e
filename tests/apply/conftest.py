"""Fixtures: the real SQLite catalog and ``orders`` table of tests/sink, for the apply
tests that commit what the executors' writers write."""

from tests.sink.conftest import catalog, catalog_properties, orders  # noqa: F401
