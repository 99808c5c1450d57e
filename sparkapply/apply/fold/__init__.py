"""The folds: one table's changes of a batch, in commit order, into their net effect.

Executor side. ``keyed`` folds a table with a key, vectorised; ``full`` a REPLICA
IDENTITY FULL table, whose rows are a multiset; ``rowwise`` is the fold that reads
every change as a row (unchanged TOAST values, key changes it cannot vectorise);
``append`` writes an insert-only batch without a fold. Which one a task takes is
decided in one place, :func:`sparkapply.apply.fold.path.choose_path`.
"""
