#!/usr/bin/env bash
# Start sparkapply as a Spark application with spark-submit (client mode: this machine
# runs the driver). The Python that runs this must have sparkapply installed; every
# worker needs the same (spark.pyspark.python in the config), or ship a packed
# virtualenv with --archives (venv-pack) and point PYSPARK_PYTHON into it.
#
#   SPARK_MASTER=spark://spark-master.internal:7077 examples/spark-submit.sh examples/cluster.toml
#
# Arguments after the config go to `sparkapply run` (e.g. --until-caught-up). Settings
# in the config's [spark.conf] win over the --conf given here.
set -euo pipefail
CONFIG=${1:-examples/cluster.toml}
shift || true
MASTER=${SPARK_MASTER:-spark://spark-master.internal:7077}   # = [spark] master in $CONFIG
# A .py file outside the sparkapply package that calls its command line.
ENTRY="$(dirname "${BASH_SOURCE[0]}")/sparkapply_main.py"

exec spark-submit \
    --master "$MASTER" \
    --deploy-mode client \
    --name sparkapply \
    --conf spark.executor.memory="${EXECUTOR_MEMORY:-4g}" \
    --conf spark.cores.max="${CORES_MAX:-16}" \
    "$ENTRY" run --config "$CONFIG" "$@"
