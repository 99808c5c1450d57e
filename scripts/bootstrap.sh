#!/usr/bin/env bash
# Installs what sparkapply needs on a fresh machine: Java 17+ for Spark (from the
# system's packages when missing), a virtualenv in .venv, and sparkapply with the
# test extra. Idempotent; sourced by scripts/test.sh and scripts/demo.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

java_ok() {
    command -v java >/dev/null 2>&1 || return 1
    local v
    v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
    [ -n "$v" ] && [ "$v" -ge 17 ]
}
if ! java_ok; then
    echo "bootstrap: installing a Java 17+ runtime for Spark" >&2
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[test]'
