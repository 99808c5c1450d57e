"""Staging: large streamed transactions written as files while they still arrive.

``stager`` (driver side) sends each closed chunk of a streamed transaction to a Spark
task; ``piece`` (executor side) decodes and writes it; ``staged`` is what staging
hands the apply at the STREAM COMMIT; ``records`` is what staging keeps under
``work_dir`` (swept at a session's start by :mod:`sparkapply.run.sweep`).
"""
