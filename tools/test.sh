#!/usr/bin/env bash
# Install everything the tests need, start the services they use, run them, stop the services.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --test
. .venv/bin/activate
export HPCDL_REQUIRE_SERVICES="${HPCDL_REQUIRE_SERVICES:-1}"
if [ -x tools/slurm_cluster.sh ]; then
    bash tools/slurm_cluster.sh start
    trap 'bash tools/slurm_cluster.sh stop' EXIT
fi
python -m pytest "$@"
