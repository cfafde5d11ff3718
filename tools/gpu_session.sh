#!/usr/bin/env bash
# Every GPU check of hpcdl in one run, for the few minutes a CUDA machine is lent (docs/gpu.md):
#
#   OUT=gpu_session bash tools/gpu_session.sh [bench] [path/to/independent_check.py]
#
# 1. tools/gpu_check.py: byte identity with the host, bound, corrupt streams, a 2^31+ tensor, streams, memory,
#    syncs per call, kernel resources and device times, GB/s, a small training step and the climate DeepLabv3+
#    step at DeepCAM's full input against bf16 autocast;
# 2. the suite's GPU-only tests;
# 3. an Nsight Compute profile of the float32 pre-pass, encode and decode kernels (when ncu is there);
# 4. with `bench`: `hpcdl bench memory --device cuda` at DeepCAM's full input (issue 14's table on the GPU);
# 5. an independent first-contact script, when its path is given.
# Each part runs under its own time limit, so a hang in one still leaves the others' reports in $OUT.
# Uses the machine's python3 (torch with CUDA, cupy); wheels of missing packages in .whl/ are installed to
# /tmp/site; the host library is the built one in hpcdl/, else built here.
set -u
OUT=${OUT:-gpu_session}
PY=${PYTHON:-python3}
BENCH=""
if [ "${1:-}" = bench ]; then BENCH=1; shift; fi
INDEPENDENT=${1:-}
mkdir -p "$OUT"
exec > >(tee "$OUT/session.log") 2>&1
log() { echo "[$(date -u +%T) +${SECONDS}s] $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
$PY -c "import sys, torch, cupy; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
'cupy', cupy.__version__, torch.cuda.get_device_name())"
if ! $PY -c "from hpcdl.compress.blocks import host; assert host.AVAILABLE" 2>/dev/null; then
    log "building the host library"
    $PY setup.py -q build_ext --inplace
fi

log "tools/gpu_check.py"
timeout 220 $PY tools/gpu_check.py --out "$OUT/gpu_check"
log "gpu_check exit $?"

log "the suite's GPU-only tests"
timeout 120 $PY -m pytest -q -p no:cacheprovider tests/test_codecs_lossless.py::test_cuda_bytes_equal_cpu_bytes \
    tests/test_codecs_quant.py::test_cuda_tensors_stay_on_the_gpu_within_one_step \
    tests/test_memory.py::test_peak_on_cuda_uses_the_allocator \
    tests/test_runtime_sz.py::test_fp16_grad_scaler_on_cuda_skips_overflowing_steps
log "GPU-only tests exit $?"

if command -v ncu >/dev/null; then
    log "ncu: the float32 pre-pass, encode and decode kernels on 256 MiB at rel 1e-2"
    timeout 120 ncu --clock-control none --kernel-name regex:'hpcdl_sz_(prepass|encode|decode)_f32' --launch-count 3 \
        --section SpeedOfLight --section Occupancy --section LaunchStats $PY -c "
import torch
from hpcdl.compress.sz import Sz
x = torch.cumsum(torch.randn(64 * 2**20, device='cuda'), 0) * 0.01
Sz.decode_with(Sz('rel', 1e-2).encode(x), 'cuda')
torch.cuda.synchronize()"
    log "ncu exit $?"
fi

if [ -n "$BENCH" ]; then
    log "hpcdl bench memory --device cuda, DeepCAM full input"
    timeout 130 $PY -m hpcdl bench memory --model deeplabv3p-climate --scale full --device cuda --batches 1,2,4 \
        --methods baseline,sz:rel=1e-2,sz:rel=1e-1,quant:bits=2,cast:bf16 --budgets 8GiB --out "$OUT/bench"
    log "bench memory exit $?"
    timeout 60 $PY -m hpcdl bench memory --model deeplabv3p-climate --scale full --device cuda --batches 1,2,4 \
        --methods recompute,recompute+sz:rel=1e-2 --out "$OUT/bench-recompute"
    log "bench memory (recompute) exit $?"
    timeout 90 $PY -m hpcdl bench memory --model deeplabv3p-climate --scale full --device cuda --batches 1,2 \
        --warmup-steps 9 --methods adaptive:probe_every=4 --out "$OUT/bench-adaptive"
    log "bench memory (adaptive) exit $?"
    rm -f "$OUT"/*/bench-memory.png  # at most 8 files come back from a lease; the JSON holds every number
fi

if [ -n "$INDEPENDENT" ]; then
    log "$INDEPENDENT"
    timeout 60 $PY "$INDEPENDENT" --quick --budget 50
    log "independent check exit $?"
fi
log done
