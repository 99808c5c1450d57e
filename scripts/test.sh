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
