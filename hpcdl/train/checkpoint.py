"""Training checkpoints: atomic, checksummed, the last K kept, and checked before anything is restored.

A checkpoint is two files: ``ckpt-00000010.pt``, a plain ``torch.save`` of a
dict of tensors, numbers and strings that ``torch.load(path, weights_only=True)``
opens (so loading runs no pickled code, and any PyTorch user can open it), and
``ckpt-00000010.pt.sha256`` beside it, in ``sha256sum`` format (``sha256sum -c``
checks it). Both are written to temporary files in the same directory, flushed
to disk and renamed into place, the checksum first, so a job killed mid-write
leaves the previous checkpoint intact (its temporary files are removed by the
next start or save) and a checkpoint file never lacks its checksum; older
checkpoints are pruned only after the new one is in place. A checkpoint whose
checksum is missing or wrong is refused. Resuming from a run directory takes the
newest checkpoint that loads: a corrupted newer one is skipped with a warning.

Checkpoints of hpcdl 0.1 (one file, ``LEGACY_MAGIC | sha256 | payload``) still load: the
embedded checksum is checked instead of the sidecar.
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

LEGACY_MAGIC = b"HPCDLCKPT1\n"  # the one-file format of hpcdl 0.1, still read
CHECKSUM_SUFFIX = ".sha256"
_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")
_TEMPORARY = re.compile(r"^\.ckpt-\d{8}\.pt(\.sha256)?\.\d+\.tmp$")  # what a write killed before its rename leaves


class CheckpointError(HpcdlError, ValueError):
    """A checkpoint that is corrupted, truncated, not ours, or made for a different run."""


class CheckpointWarning(UserWarning):
    """A bad checkpoint was skipped in favour of an earlier good one."""


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


def checksum_path(path: str | Path) -> Path:
    """The sidecar holding ``path``'s sha256: ``<path>.sha256``."""
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


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


def _write_atomically(final: Path, data: bytes) -> None:
    """``data`` into a temporary file beside ``final``, flushed to disk, renamed over ``final``."""
    temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)


def save_checkpoint(directory: str | Path, step: int, state: dict, keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``step`` (file and checksum) atomically, then keep the newest ``keep``."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 checkpoints, got {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(directory)
    buffer = io.BytesIO()
    torch.save({"step": step, **state}, buffer)
    payload = buffer.getvalue()
    final = directory / checkpoint_name(step)
    _write_atomically(checksum_path(final), f"{hashlib.sha256(payload).hexdigest()}  {final.name}\n".encode())
    _write_atomically(final, payload)
    _fsync_dir(directory)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink()
        checksum_path(old).unlink(missing_ok=True)
    return final


def _recorded_digest(path: Path, advice: str) -> bytes:
    """The sha256 that ``path``'s sidecar records."""
    sidecar = checksum_path(path)
    if not sidecar.is_file():
        raise CheckpointError(f"checkpoint {path} has no checksum file {sidecar.name} (an interrupted write, or "
                              f"not written by hpcdl){advice}")
    fields = sidecar.read_text(errors="replace").split()
    try:
        return bytes.fromhex(fields[0]) if len(fields) == 2 and len(fields[0]) == 64 else b""
    except ValueError:
        return b""


def load_checkpoint(path: str | Path) -> dict:
    """Read and verify a checkpoint file; a bad one raises CheckpointError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    blob = path.read_bytes()
    advice = ("; it was not restored. Resume from an earlier checkpoint by passing its path to --resume, "
              "or start a fresh run")
    if blob.startswith(LEGACY_MAGIC):
        digest, payload = blob[len(LEGACY_MAGIC):len(LEGACY_MAGIC) + 32], blob[len(LEGACY_MAGIC) + 32:]
    else:
        digest, payload = _recorded_digest(path, advice), blob
        if not digest:
            raise CheckpointError(f"checksum file {checksum_path(path).name} of {path} is not a sha256 line "
                                  f"('<64 hex digits>  {path.name}'){advice}")
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


def export_model(source: str | Path, out: str | Path) -> tuple[Path, int]:
    """Write the model weights of ``source`` (a checkpoint file, or a run directory's newest good checkpoint) to
    ``out`` as a plain state dict, atomically; returns (the checkpoint read, its step)."""
    source = Path(source)
    if source.is_dir():
        directory = source / "checkpoints" if (source / "checkpoints").is_dir() else source
        path, state = load_latest_good(directory)
    else:
        path, state = source, load_checkpoint(source)
    if not isinstance(state.get("model"), dict):
        raise CheckpointError(f"checkpoint {path} holds no model weights")
    out = Path(out)
    if out.is_dir():
        raise IsADirectoryError(f"--out {str(out)!r} is a directory; give a file name such as {out / 'model.pt'}")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"the directory of --out {str(out)!r} does not exist; create it first")
    buffer = io.BytesIO()
    torch.save(state["model"], buffer)
    _write_atomically(out, buffer.getvalue())
    return path, int(state["step"])
