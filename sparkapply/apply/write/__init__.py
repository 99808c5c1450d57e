"""Writing a fold's net effect: locate the live rows it replaces, write new row
versions as Parquet data files and replaced rows as position deletes. Executor side.

``locate`` finds (file, position) of live rows by key, ``effect`` turns a net effect
into files, ``parquet`` names and writes them, ``columns`` and ``keys`` bring
PostgreSQL text to the table's typed Arrow, ``file_cache`` keeps immutable files'
columns between batches.
"""
