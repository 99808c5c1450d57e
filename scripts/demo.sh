#!/usr/bin/env bash
# Fresh machine → a bundled PostgreSQL 16 with a million-row table and a live workload,
# mirrored into a local Iceberg warehouse with local Spark (embedded defaults), then a
# row-count and content-checksum comparison with a one-line verdict. Extra arguments go
# to `sparkapply demo` (e.g. --rows 200000, --verbose, --work-dir DIR). It works in
# .sparkapply-demo/, a folder of its own, and never deletes one it did not make.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The demo needs only the bundled PostgreSQL: not the test matrix's servers, nor the
# tests' Java reader.
BOOTSTRAP_PG_MATRIX=${BOOTSTRAP_PG_MATRIX:-0} BOOTSTRAP_JAVA_READER=${BOOTSTRAP_JAVA_READER:-0} \
    source scripts/bootstrap.sh
. .venv/bin/activate
exec sparkapply demo "$@"
