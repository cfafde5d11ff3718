#!/usr/bin/env bash
# Install everything the tests need, start the services they use, run them, stop the services.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --test
. .venv/bin/activate
export HPCDL_REQUIRE_SERVICES="${HPCDL_REQUIRE_SERVICES:-1}"
# The Hypothesis example counts docs/reliability.md states for CI (tests/conftest.py's "ci" profile).
export HPCDL_HYPOTHESIS_PROFILE="${HPCDL_HYPOTHESIS_PROFILE:-ci}"
if [ -x tools/slurm_cluster.sh ]; then
    bash tools/slurm_cluster.sh start
    trap 'bash tools/slurm_cluster.sh stop' EXIT
fi
python -m pytest "$@"
