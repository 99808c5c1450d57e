"""Planning, on the driver: when a batch is cut (``scheduler.py``: the assembler's
ready transactions, the operator's skip and requested cuts), and what each table of
it applies (``batch.py``, pure, over the lanes of ``graph.py``)."""
