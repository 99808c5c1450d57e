"""Planning: when a batch is cut (``scheduler.py``: the assembler's ready transactions,
the operator's skip and requested cuts), what each table of it applies (``batch.py``,
pure, over the per-table lanes of ``lanes.py``), and which task folds which key of a
big table (``partition.py``: the key partitions and the rename graph, pure, over the
row keys of ``keys.py``). The driver plans batches; the executors compute the same
key partitions from the keys they decode."""
