#!/bin/sh
# The container's entrypoint: `run` by default, any verb otherwise
# (`docker run IMAGE status --health`). The config is $SPARKAPPLY_CONFIG
# (/etc/sparkapply/sparkapply.toml unless set); exec, so that sparkapply itself gets
# SIGTERM from `docker stop` and finishes its batch.
set -eu
: "${SPARKAPPLY_CONFIG:=/etc/sparkapply/sparkapply.toml}"
export SPARKAPPLY_CONFIG
SPARKAPPLY="${SPARKAPPLY_BIN:-sparkapply}"
CHECK_FIRST="${SPARKAPPLY_CHECK_FIRST:-1}"
# The entrypoint's own settings are no config keys: sparkapply would refuse them.
unset SPARKAPPLY_BIN SPARKAPPLY_CHECK_FIRST
if [ "$#" -eq 0 ]; then
    set -- run
fi
case "$1" in
    -*) ;;  # global flags: --version, --help, -v
    run)
        if [ "$CHECK_FIRST" = "1" ]; then
            "$SPARKAPPLY" check
        fi
        ;;
esac
exec "$SPARKAPPLY" "$@"
