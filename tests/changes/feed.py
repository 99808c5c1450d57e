"""Feeding the assembler encoded messages, as the replication loop does (no server)."""

from __future__ import annotations

from pathlib import Path

from sparkapply.changes.assembler import Assembler
from sparkapply.changes.prepared import PreparedStore
from sparkapply.changes.progress import Progress
from sparkapply.changes.spool import read_records
from sparkapply.changes.transaction import CommittedTxn
from sparkapply.lsn import Lsn
from sparkapply.pgoutput import encode
from sparkapply.pgoutput import messages as m
from sparkapply.staging.stager import Stager


class Feed:
    """An assembler (protocol 4, streaming 'parallel') over ``tmp_path``, fed encoded
    messages at ascending LSNs; with ``stager``, staging while chunks arrive."""

    def __init__(self, tmp_path: Path, stager: Stager | None = None) -> None:
        self.progress = Progress(Lsn(0))
        self.store = PreparedStore(tmp_path / "prepared")
        self.asm = Assembler(
            tmp_path,
            proto_version=4,
            streaming="parallel",
            prepared=self.store,
            progress=self.progress,
            stager=stager,
        )
        self.lsn = 1000

    def __call__(self, *msgs: m.Message) -> None:
        for msg in msgs:
            self.lsn += 10
            self.asm.feed(encode(msg), self.lsn)

    def take(self) -> list[CommittedTxn]:
        """What the subscriber would hand to the apply (flushes the spool)."""
        return [t for t, _ in self.asm.take_ready(1 << 30, 1000)]

    @staticmethod
    def values(txn: CommittedTxn) -> list[int]:
        out = []
        for seg in txn.segments:
            for payload, in_stream in read_records(seg):
                if payload[0] == m.TAG_INSERT:
                    off = 9 if in_stream else 5
                    # Insert: [xid] relid 'N' ncols(2) kind(1) len(4) value
                    n = int.from_bytes(payload[off + 4 : off + 8], "big")
                    out.append(int(payload[off + 8 : off + 8 + n]))
        return out
