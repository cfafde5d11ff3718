"""Fuzzing resume with damaged checkpoints (issue 9, item 6: 'truncated or corrupted ... checkpoints').

A real run's latest checkpoint, or its sha256 sidecar, is truncated, overwritten in places or (the sidecar)
deleted; then the run is resumed as ``hpcdl train --resume`` does, from its directory and from the damaged
file. From the directory every case must fall back to the previous checkpoint with a warning naming the
damaged one (or load the latest, equal to the intact file, where the damage missed its bytes); from the
file, a CheckpointError naming it. Never another exception, never a crash, never different weights.
A fifth of the cases also rewrite the sidecar to match the damaged bytes, so that torch.load itself
reads them: those must be a CheckpointError or a load, never a crash or another exception (what they
load may differ: with a forged checksum nothing can tell). The worker is a subprocess
(tests/checkpoint_fuzz_worker.py), so a crash inside torch.load fails the test instead of killing pytest.

    HPCDL_CHECKPOINT_FUZZ_CASES=2000 pytest -s tests/test_checkpoint_fuzz.py   # a longer campaign
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hpcdl.train import load_config, run_training
from hpcdl.train.checkpoint import checksum_path, list_checkpoints

WORKER = Path(__file__).with_name("checkpoint_fuzz_worker.py")
TINY = ["data.dataset=synthetic", "data.synthetic_samples=64", "model.scale=tiny", "train.batch=16",
        "train.steps_per_epoch=2", "train.epochs=1", "logging.progress=false", "compression.method=none",
        "checkpoint.every_steps=1", "checkpoint.keep=2"]


def fuzz_cases(count: int, checkpoint_size: int, sidecar_size: int, seed: int = 0) -> list[dict]:
    """``count`` cases: truncations and overwritten bytes of the checkpoint (a fifth of them forged), and
    overwritten, truncated or deleted sidecars."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        kind = i % 5
        if kind == 0:
            cases.append({"target": "checkpoint", "damage": "truncate", "at": [int(rng.integers(0, checkpoint_size))]})
        elif kind in (1, 2, 3):
            at = sorted(int(o) for o in rng.integers(0, checkpoint_size, int(rng.integers(1, 4))))
            cases.append({"target": "checkpoint", "damage": "bytes", "at": at, "seed": int(rng.integers(1 << 30)),
                          "length": int(rng.choice([1, 4, 16, 64])), "forge": kind == 3})
        else:
            damage = ["bytes", "truncate", "delete"][i // 5 % 3]
            cases.append({"target": "sidecar", "damage": damage, "at": [int(rng.integers(0, sidecar_size))],
                          "length": int(rng.choice([1, 8])), "seed": int(rng.integers(1 << 30))})
    return cases


@pytest.mark.slow
def test_damaged_checkpoints_fall_back_or_are_named_errors_never_crashes_or_wrong_weights(tmp_path, capsys):
    run = tmp_path / "run"
    run_training(load_config("hep-particles", overrides=TINY), run_dir=run)
    latest = list_checkpoints(run / "checkpoints")[-1]
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["ckpt-00000001.pt", "ckpt-00000002.pt"]
    count = int(os.environ.get("HPCDL_CHECKPOINT_FUZZ_CASES", "200"))
    cases = fuzz_cases(count, latest.stat().st_size, checksum_path(latest).stat().st_size)
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    done = subprocess.run([sys.executable, str(WORKER), str(run), str(spec)], capture_output=True, text=True,
                          timeout=1200, env={**os.environ, "OMP_NUM_THREADS": "1"})
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and len(results) == count, \
        f"the worker died (exit {done.returncode}) in case {len(results)}: {cases[len(results):][:1]}: " \
        f"{done.stderr[-2000:]}"

    tally = Counter()
    for case, result in zip(cases, results):
        outcomes = (result["directory"], result["file"])
        forged = case.get("forge", False)
        tally[("forged " if forged else "") + "/".join(outcomes)] += 1
        if forged:
            assert not any(o.startswith("OTHER") for o in outcomes), (case, result)
            continue
        assert outcomes in (("fallback", "error"), ("latest", "latest")), (case, result)
    with capsys.disabled():
        print(f"\ncheckpoint fuzz: {count} cases: {dict(sorted(tally.items()))}")
    assert tally["fallback/error"] > count // 2  # the campaign does reach the checks
