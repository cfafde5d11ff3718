#!/usr/bin/env bash
# Create .venv and install hpcdl into it, with the CPU build of PyTorch.
#   bash tools/setup.sh          # the package, for `hpcdl demo`
#   bash tools/setup.sh --test   # plus test tools, optional peers, MPI and Horovod, and qemu-user (x86-64)
set -euo pipefail
cd "$(dirname "$0")/.."
with_test=0
[ "${1:-}" = "--test" ] && with_test=1

[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Pinned so pip takes the CPU build on disk instead of a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
if [ "$with_test" = 1 ]; then
    python -m pip install -q -e '.[test]'
    # tests/test_host_isa.py runs the host kernels as older x86-64 CPUs (no AVX-512, no AVX2) under qemu-user.
    if [ "$(uname -m)" = x86_64 ] && ! command -v qemu-x86_64 >/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user >/dev/null \
                || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user >/dev/null; }
        else
            echo "setup.sh: install qemu-user (qemu-x86_64) for tests/test_host_isa.py" >&2
        fi
    fi
    if [ -x tools/build_horovod.sh ]; then
        bash tools/build_horovod.sh
    fi
    # Pythia 8 takes over an hour to build, so it is never built here; a wheel someone built
    # (pip wheel pythia8mc -w DIR) is installed when the cache has one, and its tests run.
    wheel_cache="${HPCDL_WHEEL_CACHE:-/var/cache/hpcdl/wheels}"
    for wheel in "$wheel_cache"/pythia8mc-*.whl; do
        [ -f "$wheel" ] && python -m pip install -q "$wheel"
    done
else
    python -m pip install -q -e .
fi
echo "hpcdl installed in $(pwd)/.venv"
