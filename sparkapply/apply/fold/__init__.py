"""The folds: one table's changes of a batch, in commit order, into their net effect.

Executor side; what a fold returns is written by ``apply/write/``.

- ``path``: which fold a task takes, decided in one function (:func:`.path.choose_path`
  returns a ``FoldPath``), as PostgreSQL's ``get_transaction_apply_action``; a
  vectorised fold that cannot net what it meets raises ``NeedsRowFold`` and the task
  falls back to the row-wise fold.
- ``events``: the one event kernel of the vectorised folds: the batch decoded into
  runs, every change made numbered events on an identity, the events grouped per
  identity in commit order, the kept events gathered back into typed rows.
- ``keyed``: the net effect per key, over the kernel (a big table's keys split over
  several tasks by ``plan/partition.py``).
- ``full``: the net effect per row image of a REPLICA IDENTITY FULL table (rows are a
  multiset), over the kernel.
- ``rowwise``: change by change, for what the vectorised folds cannot net (unchanged
  TOAST values with a key change, key columns that change mid-batch, mixed identities).
- ``append``: an insert-only batch, decoded column-wise and appended without a fold.
"""
