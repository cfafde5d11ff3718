#!/usr/bin/env bash
# The commands that produced the committed study in docs/results/ (CPU, 2 cores shared with other work).
# Run from the repository root with the venv active; OUT holds results.jsonl and the trainer's run
# directories (the run directories are not committed). Each command resumes if interrupted.
set -euo pipefail
OUT=${OUT:-study}
METHODS=baseline,sz:rel=1e-1,sz:rel=1e-2,sz:rel=1e-3,sz:abs=1e-2,quant:bits=2,quant:bits=4,cast:bf16,recompute,offload

# HEP on the committed Pythia 8 sample (hep-sample: 2400 training / 600 validation jets). The jet-image CNN
# (tiny): 3 epochs of at most 25 steps of 64 (about two passes over the jets; it reaches AUC ~0.94 within one).
nice python -m hpcdl study run --models hep-cnn --methods "$METHODS" --seeds 0,1 --epochs 3 \
    --steps-per-epoch 25 --threads 1 --out "$OUT"
# The particle transformer (tiny) learns more slowly: 6 full epochs of 37 steps of 64.
nice python -m hpcdl study run --models particle-transformer --methods "$METHODS" --seeds 0,1 --epochs 6 \
    --threads 1 --out "$OUT"

# Climate: DeepLabv3+ (tiny) on the committed climate sample (48 QG snapshots), shipped config climate-deeplab.
nice python -m hpcdl study run --models deeplabv3p-climate --methods "$METHODS" --seeds 0,1 --epochs 6 \
    --threads 1 --out "$OUT"

# ResNet-18 (CIFAR stem, tiny): no CIFAR here, so random CIFAR-shaped inputs with random labels:
# memory and speed only, its validation metric means nothing.
nice python -m hpcdl study run --models resnet18-cifar --methods "$METHODS" --seeds 0,1 --epochs 3 \
    --steps-per-epoch 10 --batch 32 --set data.dataset=synthetic --set data.synthetic_samples=320 \
    --threads 1 --out "$OUT"

python -m hpcdl study report "$OUT"
