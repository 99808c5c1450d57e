"""What the benchmarks share: servers, workloads, consumers, /proc metering, reporting.

The scripts in ``bench/`` run as ``python bench/<name>.py`` from the repository root;
Python puts ``bench/`` first on the path, so ``import benchlib`` finds this package.
Nothing here is imported by Spark's Python workers: work shipped to them refers only to
the sparkapply package (and the standard library).
"""
