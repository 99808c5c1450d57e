"""Everything under ``work_dir``: where each file lives, how it is made durable, the
prepared store's files and the last verify's verdict.

Below ``changes/`` in the import order: nothing here imports ``changes``, ``apply``
or ``sink``; those give the files their meaning.
"""
