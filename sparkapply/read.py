"""Reading the mirror from Python: the stable import path for users.

``from sparkapply.read import cut_snapshots, latest_cut, read_table`` is what the
README documents and what readers' code imports; the functions live in
:mod:`sparkapply.sink.read`, beside the rest of what reads Iceberg.
"""

from sparkapply.sink.read import cut_snapshots, latest_cut, read_table

__all__ = ["cut_snapshots", "latest_cut", "read_table"]
