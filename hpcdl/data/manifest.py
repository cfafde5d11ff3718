"""The data set manifest: what a generated data set is, how it was made, and how to check and normalise it.

A data set directory holds its data files and one ``manifest.json``::

    {
      "format": "hpcdl-dataset", "version": 1,
      "name": "climate", "kind": "climate-netcdf" | "hep-hdf5" | "deepcam-hdf5",
      "task": "segmentation" | "classification", "num_classes": 3, "class_names": [...],
      "sample_shape": [C, H, W] (climate) or {"images": [1, H, W], "constituents": [N, F]} (HEP),
      "count": number of samples, "seed": generator seed,
      "generator": {"module": ..., "settings": {...}}, "created": ISO time, "command": ...,
      "files": [{"path": relative path, "bytes": size, "sha256": hex digest, "samples": count}],
      "normalization": {feature set: {"names": [...], "mean": [...], "std": [...]}}
    }

The per-channel ``mean``/``std`` are computed by the generator over the whole data set (for
HEP constituents: over real particles, not padding); loaders subtract and divide by them.
The byte sizes make a truncated copy detectable without reading the file; the checksums make any
corruption detectable by ``verify_checksums`` (``hpcdl data verify DIR``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ChecksumError, MalformedFileError, MissingFileError, TruncatedFileError

MANIFEST_NAME = "manifest.json"
FORMAT = "hpcdl-dataset"
VERSION = 1
KINDS = ("climate-netcdf", "hep-hdf5", "deepcam-hdf5")
#: The normalisation entries each kind's loader needs.
NORMALIZATION_KEYS = {"climate-netcdf": ("fields",), "deepcam-hdf5": ("fields",), "hep-hdf5": ("images", "constituents")}
_REQUIRED = ("format", "version", "name", "kind", "task", "num_classes", "class_names", "sample_shape",
             "count", "seed", "generator", "files", "normalization")


@dataclass
class Manifest:
    """A parsed, validated manifest; ``root`` is the directory that the file paths are relative to."""

    root: Path
    name: str
    kind: str
    task: str
    num_classes: int
    class_names: list[str]
    sample_shape: Any
    count: int
    seed: int
    generator: dict
    files: list[dict]
    normalization: dict
    extra: dict = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.root / MANIFEST_NAME

    def file_paths(self) -> list[Path]:
        return [self.root / entry["path"] for entry in self.files]

    def to_json(self) -> dict:
        body = {"format": FORMAT, "version": VERSION, "name": self.name, "kind": self.kind, "task": self.task,
                "num_classes": self.num_classes, "class_names": self.class_names,
                "sample_shape": self.sample_shape, "count": self.count, "seed": self.seed,
                "generator": self.generator, "files": self.files, "normalization": self.normalization}
        body.update(self.extra)
        return body

    def check_sizes(self) -> None:
        """Raise ``MissingFileError``/``TruncatedFileError`` if a file is absent or has another size."""
        for entry, path in zip(self.files, self.file_paths()):
            if not path.is_file():
                raise MissingFileError(path, f"listed in {self.path} but does not exist")
            size = path.stat().st_size
            if size < entry["bytes"]:
                raise TruncatedFileError(path, f"is {size} bytes but the manifest records {entry['bytes']}: "
                                               "the file is truncated (an incomplete copy?)")
            if size != entry["bytes"]:
                raise MalformedFileError(path, f"is {size} bytes but the manifest records {entry['bytes']}: "
                                               "the file was replaced or appended to")


def sha256_of(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (never whole into memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def file_entry(root: Path, path: Path, samples: int) -> dict:
    """Manifest entry of one data file: relative path, size, checksum, sample count."""
    return {"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size, "sha256": sha256_of(path),
            "samples": int(samples)}


def write_manifest(root: str | Path, *, name: str, kind: str, task: str, class_names: list[str], sample_shape: Any,
                   seed: int, generator: dict, files: list[tuple[Path, int]], normalization: dict,
                   extra: dict | None = None) -> Manifest:
    """Checksum ``files`` ((path, samples) pairs under ``root``) and write ``root/manifest.json``."""
    root = Path(root)
    entries = [file_entry(root, Path(path), samples) for path, samples in files]
    details = {"created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    details.update(extra or {})
    manifest = Manifest(root=root, name=name, kind=kind, task=task, num_classes=len(class_names),
                        class_names=list(class_names), sample_shape=sample_shape,
                        count=sum(entry["samples"] for entry in entries), seed=int(seed), generator=generator,
                        files=entries, normalization=normalization, extra=details)
    manifest.path.write_text(json.dumps(manifest.to_json(), indent=1) + "\n")
    return manifest


def read_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest, given it or the directory that holds it."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise MissingFileError(path, "no data set manifest here; generate one with `hpcdl data make climate|hep "
                                     "--out DIR` or pass a directory that holds a manifest.json")
    try:
        body = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MalformedFileError(path, f"is not valid JSON ({err}), so not a data set manifest; pass a directory "
                                       "that holds a manifest.json (`hpcdl data make` writes one), or the manifest") from None
    if not isinstance(body, dict):
        raise MalformedFileError(path, "must hold a JSON object")
    missing = [key for key in _REQUIRED if key not in body]
    if missing:
        raise MalformedFileError(path, f"lacks the keys {missing}")
    if body["format"] != FORMAT or body["version"] != VERSION:
        raise MalformedFileError(path, f"has format {body['format']!r} version {body['version']!r}; "
                                       f"expected {FORMAT!r} version {VERSION}")
    if body["kind"] not in KINDS:
        raise MalformedFileError(path, f"has kind {body['kind']!r}; expected one of {KINDS}")
    for entry in body["files"]:
        if not {"path", "bytes", "sha256", "samples"} <= set(entry):
            raise MalformedFileError(path, f"file entry {entry} needs path, bytes, sha256 and samples")
    if sum(entry["samples"] for entry in body["files"]) != body["count"]:
        raise MalformedFileError(path, "count differs from the sum of the files' sample counts")
    if len(body["class_names"]) != body["num_classes"]:
        raise MalformedFileError(path, "num_classes differs from the number of class_names")
    _check_normalization(path, body["kind"], body["normalization"])
    extra = {key: value for key, value in body.items() if key not in _REQUIRED}
    return Manifest(root=path.parent, name=body["name"], kind=body["kind"], task=body["task"],
                    num_classes=int(body["num_classes"]), class_names=list(body["class_names"]),
                    sample_shape=body["sample_shape"], count=int(body["count"]), seed=int(body["seed"]),
                    generator=body["generator"], files=body["files"], normalization=body["normalization"],
                    extra=extra)


def _check_normalization(path: Path, kind: str, normalization) -> None:
    """Every entry the kind needs is there: equally long lists of names, finite means and finite stds."""
    if not isinstance(normalization, dict):
        raise MalformedFileError(path, f"normalization must be an object of feature sets, got {normalization!r}")
    missing = [key for key in NORMALIZATION_KEYS[kind] if key not in normalization]
    if missing:
        raise MalformedFileError(path, f"normalization lacks {missing}: a {kind} data set needs "
                                       f"{list(NORMALIZATION_KEYS[kind])}, each with names, mean and std")
    for key, entry in normalization.items():
        where = f"normalization[{key!r}]"
        if not isinstance(entry, dict) or not {"names", "mean", "std"} <= set(entry):
            raise MalformedFileError(path, f"{where} must hold names, mean and std")
        lengths = {len(entry[part]) if isinstance(entry[part], list) else -1 for part in ("names", "mean", "std")}
        if len(lengths) != 1 or -1 in lengths:
            raise MalformedFileError(path, f"{where}: names, mean and std must be lists of one length")
        for part in ("mean", "std"):
            for name, value in zip(entry["names"], entry[part]):
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                    raise MalformedFileError(path, f"{where} {part} of {name!r} is {value!r}, expected a finite number")


def verify_checksums(manifest: Manifest) -> int:
    """Check every file's size and sha256 against the manifest; returns the number of files checked."""
    manifest.check_sizes()
    for entry, path in zip(manifest.files, manifest.file_paths()):
        actual = sha256_of(path)
        if actual != entry["sha256"]:
            raise ChecksumError(path, f"sha256 is {actual} but the manifest records {entry['sha256']}")
    return len(manifest.files)
