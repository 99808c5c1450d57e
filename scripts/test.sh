#!/usr/bin/env bash
# Fresh machine → installed → every test run (real PostgreSQL 16, Spark, Iceberg).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
. .venv/bin/activate
ruff check sparkapply tests bench
ruff format --check sparkapply tests bench
mypy
python -m pytest "$@"
# The whole suite runs on the newest Spark (.venv); the end-to-end core runs again on
# Spark 3.5, what most clusters run (the copy, streamed, staged and prepared
# transactions, kills at every commit point are the newest's only: their Spark use is
# the same code paths as these).
if [ "$#" -eq 0 ]; then
    .venv-spark35/bin/python -c 'import pyspark; assert pyspark.__version__.startswith("3.5")'
    .venv-spark35/bin/python -m pytest -p no:cacheprovider \
        tests/e2e/test_basic.py tests/e2e/test_streaming.py tests/e2e/test_twophase.py \
        tests/e2e/test_staging.py
fi
