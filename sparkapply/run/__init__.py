"""The run: the subscriber's loop, which ties source, assembly, apply and sink together.

``subscriber`` is the loop and its threads (receive, apply, acknowledge) and the
sessions one after another; ``session`` makes one replication session's parts and
what its apply thread runs; ``batch`` is the driver's side of a batch (tables loaded,
one Spark job, the snapshots and the cut committed, expiry); ``errors`` says a batch's
failure (Spark's own, or the transaction to skip); ``sweep`` removes, at a session's
start, what staging wrote for transactions that never committed.
"""
