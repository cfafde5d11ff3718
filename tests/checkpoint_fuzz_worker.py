"""Worker of tests/test_checkpoint_fuzz.py: resume from damaged copies of a real run's checkpoints.

    python tests/checkpoint_fuzz_worker.py RUN_DIR CASES.json

RUN_DIR holds ``checkpoints/`` with two good checkpoints (the latest is the one damaged). Each case
``{"target": "checkpoint"|"sidecar", "damage": "truncate"|"bytes"|"delete", "at": [offsets], "length": n,
"seed": s, "forge": bool}`` damages a copy of the latest checkpoint or of its sha256 sidecar (``forge``
rewrites the sidecar to match damaged checkpoint bytes, so that torch.load itself reads them), then resumes
the way ``hpcdl train --resume`` does (``hpcdl.train.trainer._resume_source``), from the run directory
and from the damaged file. Before case I the worker prints ``start I``, after it one JSON line:
``{"case": I, "directory": outcome, "file": outcome, "message": ...}``, where an outcome is ``"latest"``
(the latest checkpoint loaded, equal to the intact one), ``"fallback"`` (the previous checkpoint loaded,
equal to the intact one, with a CheckpointWarning naming the damaged file), ``"error"`` (a CheckpointError
naming the file or directory), ``"wrong"`` (something loaded that differs from the intact checkpoint it
claims to be), or ``"OTHER:<type>"`` (any other exception or an unnamed file: a bug). A crash leaves a
``start I`` without its line.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from hpcdl.train.checkpoint import (
    CheckpointError,
    CheckpointWarning,
    checksum_path,
    list_checkpoints,
    load_checkpoint,
)
from hpcdl.train.trainer import _resume_source


def same(a, b) -> bool:
    """Whether two loaded checkpoint states are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def damage(case: dict, latest: Path) -> None:
    """Apply ``case`` to the latest checkpoint or its sidecar."""
    target = checksum_path(latest) if case["target"] == "sidecar" else latest
    if case["damage"] == "delete":
        target.unlink()
        return
    data = bytearray(target.read_bytes())
    if case["damage"] == "truncate":
        data = data[: case["at"][0] % max(len(data), 1)]
    else:
        rng = np.random.default_rng(case["seed"])
        for offset in case["at"]:
            start = offset % len(data)
            end = min(start + case["length"], len(data))
            data[start:end] = rng.integers(0, 256, end - start, dtype=np.uint8).tobytes()
    target.write_bytes(bytes(data))
    if case.get("forge"):
        import hashlib

        checksum_path(latest).write_text(f"{hashlib.sha256(bytes(data)).hexdigest()}  {latest.name}\n")


def resume(source: Path, intact: dict[str, dict], damaged: Path) -> tuple[str, str]:
    """(outcome, message) of resuming from ``source`` (a run directory or the damaged checkpoint file)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _run_dir, path, state = _resume_source(source, {})
        except CheckpointError as err:
            named = str(source) in str(err) or damaged.name in str(err)
            return ("error" if named else "OTHER:unnamed"), str(err)[:300]
        except Exception as err:  # noqa: BLE001 - any other exception type is what the campaign looks for
            return f"OTHER:{type(err).__name__}", str(err)[:300]
    if not same(state, intact[path.name]):
        return "wrong", f"{path.name} loaded with values that differ from the intact file"
    if path.name == damaged.name:
        return "latest", ""
    notes = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    if not any(damaged.name in note for note in notes):
        return "OTHER:silent-fallback", f"fell back to {path.name} without a warning naming {damaged.name}"
    return "fallback", notes[0][:300]


def main() -> None:
    run_dir, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    intact = {path.name: load_checkpoint(path) for path in list_checkpoints(run_dir / "checkpoints")}
    for index, case in enumerate(cases):
        print(f"start {index}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "run"
            shutil.copytree(run_dir / "checkpoints", copy / "checkpoints")
            latest = list_checkpoints(copy / "checkpoints")[-1]
            damage(case, latest)
            directory, message = resume(copy, intact, latest)
            file, file_message = resume(latest, intact, latest)
        print(json.dumps({"case": index, "directory": directory, "file": file,
                          "message": message if directory != "fallback" else file_message}), flush=True)


if __name__ == "__main__":
    main()
