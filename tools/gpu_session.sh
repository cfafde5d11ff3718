#!/usr/bin/env bash
# Every GPU check of hpcdl in one run, for the few minutes a CUDA machine is lent (docs/gpu.md):
#
#   OUT=gpu_session bash tools/gpu_session.sh [path/to/independent_check.py]
#
# 1. tools/gpu_check.py: byte identity with the host, bound, corrupt streams, a 2^31+ tensor, streams, memory,
#    syncs per call, GB/s, a small training step and the climate DeepLabv3+ step at DeepCAM's full input;
# 2. `hpcdl bench memory --device cuda` at DeepCAM's full input (the issue 14 table measured on the GPU);
# 3. an independent first-contact script, when its path is given.
# Each part runs under its own time limit, so a hang in one still leaves the others' reports in $OUT.
# Uses the machine's python3 (torch with CUDA, cupy); wheels of missing packages in .whl/ are installed to
# /tmp/site; the host library is the built one in hpcdl/, else built here.
set -u
OUT=${OUT:-gpu_session}
PY=${PYTHON:-python3}
INDEPENDENT=${1:-}
mkdir -p "$OUT"
exec > >(tee "$OUT/session.log") 2>&1
log() { echo "[$(date -u +%T) +${SECONDS}s] $*"; }

log "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
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

log "1/3 tools/gpu_check.py"
timeout 220 $PY tools/gpu_check.py --out "$OUT/gpu_check"
log "gpu_check exit $?"

log "2/3 hpcdl bench memory --device cuda, DeepCAM full input"
timeout 130 $PY -m hpcdl bench memory --model deeplabv3p-climate --scale full --device cuda --batches 1,2,4 \
    --methods baseline,sz:rel=1e-2,sz:rel=1e-1,quant:bits=2,cast:bf16 --budgets 8GiB --out "$OUT/bench"
log "bench memory exit $?"
timeout 60 $PY -m hpcdl bench memory --model deeplabv3p-climate --scale full --device cuda --batches 1,2,4 \
    --methods recompute,recompute+sz:rel=1e-2 --out "$OUT/bench-recompute"
bench=$?
log "bench memory (recompute) exit $bench"
if [ $bench -ne 0 ]; then
    log "a recomputed step of the small DeepLabv3+ under anomaly detection (which forward op)"
    timeout 60 $PY -c "
import torch
from hpcdl.memory import TrainStep, Workload
from hpcdl.runtime.methods import Recompute
torch.autograd.set_detect_anomaly(True)
TrainStep(Workload('deeplabv3p-climate', 'tiny'), 2, device='cuda', method=Recompute())()()
print('recomputed step ok')"
fi
timeout 90 $PY -m hpcdl bench memory --model deeplabv3p-climate --scale full --device cuda --batches 1,2 \
    --warmup-steps 9 --methods adaptive:probe_every=4 --out "$OUT/bench-adaptive"
log "bench memory (adaptive) exit $?"

if [ -n "$INDEPENDENT" ]; then
    log "3/3 $INDEPENDENT"
    timeout 60 $PY "$INDEPENDENT" --quick --budget 50
    log "independent check exit $?"
fi
rm -f "$OUT"/*/bench-memory.png  # at most 8 files come back from a lease; the JSON holds every number
log done
