"""Training checkpoints: atomic, checksummed, the last K kept, and checked before anything is restored.

A checkpoint file is ``MAGIC | sha256 of the payload | payload`` where the
payload is a ``torch.save`` of a dict of plain tensors, numbers and strings
(loaded with ``weights_only=True``, so loading runs no pickled code). It is
written to a temporary file in the same directory, flushed to disk and renamed
into place, so a job killed mid-write leaves the previous checkpoint intact (its
temporary file is removed by the next start or save); older checkpoints are
pruned only after the new one is in place. Resuming from a run directory takes
the newest checkpoint that loads: a corrupted newer one is skipped with a warning.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from hpcdl.errors import HpcdlError

MAGIC = b"HPCDLCKPT1\n"
_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")
_TEMPORARY = re.compile(r"^\.ckpt-\d{8}\.pt\.\d+\.tmp$")  # what a write killed before its rename leaves


class CheckpointError(HpcdlError, ValueError):
    """A checkpoint that is corrupted, truncated, not ours, or made for a different run."""


class CheckpointWarning(UserWarning):
    """A bad checkpoint was skipped in favour of an earlier good one."""


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


def list_checkpoints(directory: str | Path) -> list[Path]:
    """The checkpoints in ``directory``, oldest step first (temporary files are not checkpoints)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | Path) -> Path | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Delete the ``.ckpt-*.tmp`` files a killed write left in ``directory``; returns what was removed.

    Only one process writes a run's checkpoints, so any such file when it starts or saves is a leftover.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [path for path in directory.iterdir() if _TEMPORARY.match(path.name)]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def save_checkpoint(directory: str | Path, step: int, state: dict, keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``step`` atomically, then keep only the newest ``keep``."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 checkpoints, got {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(directory)
    buffer = io.BytesIO()
    torch.save({"step": step, **state}, buffer)
    payload = buffer.getvalue()
    final = directory / checkpoint_name(step)
    temporary = directory / f".{final.name}.{os.getpid()}.tmp"
    with open(temporary, "wb") as handle:
        handle.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)
    _fsync_dir(directory)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink()
    return final


def load_checkpoint(path: str | Path) -> dict:
    """Read and verify a checkpoint file; a bad one raises CheckpointError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    blob = path.read_bytes()
    advice = ("; it was not restored. Resume from an earlier checkpoint by passing its path to --resume, "
              "or start a fresh run")
    if not blob.startswith(MAGIC):
        raise CheckpointError(f"{path} is not an hpcdl checkpoint (bad magic bytes){advice}")
    digest, payload = blob[len(MAGIC):len(MAGIC) + 32], blob[len(MAGIC) + 32:]
    if len(digest) < 32 or hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {path} is corrupted or truncated (sha256 mismatch){advice}")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for unreadable archives
        raise CheckpointError(f"checkpoint {path} cannot be read: {err}{advice}") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"checkpoint {path} has no training state{advice}")
    return state


def load_latest_good(directory: str | Path) -> tuple[Path, dict]:
    """The newest checkpoint in ``directory`` that loads, and its state.

    A corrupted or truncated newer one is skipped with a :class:`CheckpointWarning` naming it (and left
    in place); CheckpointError if none loads, FileNotFoundError if there is none.
    """
    checkpoints = list_checkpoints(directory)
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoint in {str(directory)!r} to resume from")
    problems = []
    for path in reversed(checkpoints):
        try:
            state = load_checkpoint(path)
        except CheckpointError as err:
            problems.append(str(err).split("; it was not restored")[0])
            continue
        for problem in problems:
            warnings.warn(f"skipped a bad checkpoint, resuming from {path.name} instead: {problem}",
                          CheckpointWarning, stacklevel=2)
        return path, state
    raise CheckpointError(f"no checkpoint in {str(directory)!r} loads ({'; '.join(problems)}); start a fresh run")


def check_compatible(state: dict, expected: dict, path: str | Path) -> None:
    """Refuse a checkpoint whose run identity (model, data, global batch, ...) differs from this run's."""
    saved = state.get("identity", {})
    differences = [f"{key}: checkpoint has {saved.get(key)!r}, this run has {value!r}"
                   for key, value in expected.items() if saved.get(key) != value]
    if differences:
        raise CheckpointError(f"checkpoint {path} belongs to a different run ({'; '.join(differences)}); "
                              "resume with the config it was made with, or start a fresh run")


def rng_state() -> dict:
    """Every random generator the training step can touch, in weights_only-loadable form."""
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gauss],
        "python": list(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached_gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gauss))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
