"""The apply: a batch's table tasks folded and written on the executors, as one Spark job.

``job`` runs the table tasks as one Spark job (the driver's side of a batch is
:mod:`sparkapply.run.batch`); ``tasks`` is what one task does, and chooses its path
(``choose_path``); ``fold/`` computes net effects; ``write/`` turns them into files.
``session``, ``daemon`` and ``warm`` set up Spark and its Python workers.
"""
