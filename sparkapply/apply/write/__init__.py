"""Writing a fold's net effect: locate the live rows it replaces, write new row
versions as Parquet data files and replaced rows as position deletes. Executor side.

``locate`` finds (file, position) of live rows by key, ``effect`` turns a net effect
into files, ``parquet`` names and writes them, ``columns`` brings PostgreSQL text to
the table's typed Arrow (whose keys ``plan/keys.py`` makes comparable),
``file_cache`` keeps immutable files' columns between batches.
"""
