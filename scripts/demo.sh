#!/usr/bin/env bash
# Fresh machine → a bundled PostgreSQL 16 with a live workload, mirrored into a local
# Iceberg warehouse with local Spark (configs/local.toml), and a row-count comparison.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
. .venv/bin/activate
exec sparkapply demo --config configs/local.toml "$@"
