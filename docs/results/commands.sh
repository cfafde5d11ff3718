#!/usr/bin/env bash
# The commands for the committed study in docs/results/ (CPU, 2 cores shared with other work).
# The committed results: every run re-run at c6aebf0 on 2026-12-07 in one go, on one machine (2-core AMD EPYC
# Zen 3 VM), with this script as it is: `OUT=/tmp/s39/study bash docs/results/commands.sh`, 76 minutes; for about
# 15 of them a memory bench and tests ran on the second core, so a few runs' step times are rougher. The run
# before, at 7e5ce99 on 2026-12-05 (2-core Intel Xeon VM, nothing else running, 36 minutes), is in the git
# history of docs/results; before it, the rows came from several commits and machines (first-step losses then
# differed in the last bit between machines, and step times between a loaded and an idle machine).
# Run from the repository root with the venv active; OUT holds results.jsonl and the trainer's run
# directories (the run directories are not committed). Each command resumes if interrupted: a run
# already in OUT's results (same model, method, seed, settings and resolved config) is not run again.
set -euo pipefail
OUT=${OUT:-study}
SEEDS=0,1,2
METHODS=baseline,sz:rel=1e-1,sz:rel=1e-2,sz:rel=1e-3,sz:abs=1e-2,quant:bits=2,quant:bits=4,cast:bf16,recompute,offload
# the static sz settings with the lossless zstd stage over their streams (docs/codecs.md#entropy)
METHODS=$METHODS,sz:rel=1e-1,entropy=zstd,sz:rel=1e-2,entropy=zstd

# study MODEL PROBE_EVERY [hpcdl study run options]: every method of METHODS and the adaptive policy, then the
# ActNN-style baseline (per-layer 1/2/4/8 bits from sensitivity) at the same bytes: its average bits are
# 32 (fp32 activations) / adaptive's activation ratio after its first decision, mean over the seeds, read
# from OUT's results by `hpcdl study matched-bits`. Same seeds, epochs, steps and data as the other methods.
# Both controllers probe every PROBE_EVERY steps, about 8 times per run: a bound grows at most 2x per probe
# from 1% of its tensor's range, so a run with one probe (the default probe_every=100 here) would never loosen.
study() {
    local model=$1 adaptive=adaptive:probe_every=$2 probe_every=$2 bits
    shift 2
    nice python -m hpcdl study run --models "$model" --methods "$METHODS,$adaptive" --seeds "$SEEDS" \
        --threads 1 --out "$OUT" "$@"
    bits=$(python -m hpcdl study matched-bits "$OUT" --model "$model" --method "$adaptive")
    # ActNN's fewest bits are 1: where adaptive packs below 1 bit per element (hep-cnn: 0.96), it runs at 1
    bits=$(python -c "print(1 if float('$bits') < 1 else '$bits')")
    # If the ActNN runs fail (a failed run is recorded in results.jsonl with its error) or the spec is refused
    # (the error is printed above), the other models still run.
    nice python -m hpcdl study run --models "$model" --methods "actnn:bits=$bits,probe_every=$probe_every" \
        --seeds "$SEEDS" --threads 1 --out "$OUT" "$@" ||
        echo "actnn:bits=$bits on $model did not finish: see the error above"
}

# HEP on the committed Pythia 8 sample (hep-sample: 2400 training / 600 validation jets). The jet-image CNN
# (tiny): 3 epochs of at most 25 steps of 64 (about two passes over the jets; it reaches AUC ~0.94 within one).
study hep-cnn 10 --epochs 3 --steps-per-epoch 25
# The particle transformer (tiny) learns more slowly: 6 full epochs of 37 steps of 64.
study particle-transformer 25 --epochs 6

# Climate: DeepLabv3+ (tiny) on the committed climate sample (48 QG snapshots), shipped config climate-deeplab:
# 6 epochs of 4 steps of 8.
study deeplabv3p-climate 3 --epochs 6

# ResNet-18 (CIFAR stem, tiny): no CIFAR here, so random CIFAR-shaped inputs with random labels:
# memory and speed only, its validation metric means nothing.
study resnet18-cifar 4 --epochs 3 --steps-per-epoch 10 --batch 32 \
    --set data.dataset=synthetic --set data.synthetic_samples=320

# The adaptive policy with a looser budget: compression may add as much gradient variance as SGD's own
# sampling (alpha=1; the default 0.1 allows a tenth). Same seeds and data; no ActNN run matched to it.
alpha_one() {
    local model=$1 probe_every=$2
    shift 2
    nice python -m hpcdl study run --models "$model" --methods "adaptive:alpha=1,probe_every=$probe_every" \
        --seeds "$SEEDS" --threads 1 --out "$OUT" "$@"
}
alpha_one hep-cnn 10 --epochs 3 --steps-per-epoch 25
alpha_one resnet18-cifar 4 --epochs 3 --steps-per-epoch 10 --batch 32 \
    --set data.dataset=synthetic --set data.synthetic_samples=320
alpha_one particle-transformer 25 --epochs 6
alpha_one deeplabv3p-climate 3 --epochs 6

python -m hpcdl study report "$OUT"
