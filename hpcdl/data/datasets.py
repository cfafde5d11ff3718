"""``load_dataset``: a torch-style Dataset for a generated data set, a committed sample, or random data.

Items are ``(x, y)``: ``x`` a float32 tensor normalised with the manifest's per-channel statistics,
``y`` an int64 class (classification) or an int64 (H, W) class map (segmentation). ``dataset.info``
describes the data (task, num_classes, input_shape, class_names, source, ...).

Train/val splits are deterministic: climate snapshots form a time series, so the validation set
is the last ``val_fraction`` of the snapshots in time (no near-duplicate neighbours across the
split); HEP jets are independent, so the split is a seeded permutation, and each split keeps that
permutation's order (the file holds signal and background in generation order, so any prefix of a
split mixes both classes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .deepcam_dir import deepcam_manifest, is_deepcam_dir
from .errors import MalformedFileError, MissingFileError, ShapeError, ValueRangeError
from .features import CONSTITUENT_FEATURES, HEP_UNITS, NORMALISED_FEATURES, constituent_features
from .manifest import Manifest, read_manifest, verify_checksums
from .readers import FLOAT, INTEGER, ClimateNetCDFReader, DeepCAMReader, FileReader, HDF5Reader
from .samples import SAMPLE_NAMES, sample_path
from .synthetic import RANDOM_DATASETS, random_dataset

SPLITS = ("train", "val", "all")
HEP_FEATURES = ("images", "constituents")
#: The HDF5 datasets each HEP input needs (the label is always read too); nothing else is read.
HEP_FIELDS = {"images": ["images"], "constituents": ["constituents", "n_constituents", "jet_eta", "jet_phi"]}


def split_indices(count: int, split: str, val_fraction: float, time_ordered: bool, seed: int) -> np.ndarray:
    """Global sample indices of ``split``; train and val are disjoint and together cover all samples.

    Time-ordered data keeps time order. Otherwise the indices stay in the seeded permutation's
    order, not sorted: a file written class by class must not give a one-class prefix of the
    validation set (a capped evaluation reads only the first items).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if split == "all":
        return np.arange(count)
    n_val = int(round(count * val_fraction))
    if val_fraction > 0 and count > 1:
        n_val = min(max(n_val, 1), count - 1)
    order = np.arange(count) if time_ordered else np.random.default_rng(seed).permutation(count)
    return order[count - n_val:] if split == "val" else order[:count - n_val]


class ManifestDataset(torch.utils.data.Dataset):
    """A split of a data set on disk: ``len`` samples, read lazily through ``reader``."""

    reader: FileReader  # set by each subclass's constructor

    def __init__(self, manifest: Manifest, indices: np.ndarray, info: dict) -> None:
        self.manifest = manifest
        self.indices = indices
        self.info = info

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, item: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([item])[0]

    def __getitems__(self, items: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Several items with one hand-over to the I/O thread (torch's DataLoader and ``ShardedLoader``
        fetch whole batches through this), rather than one per item."""
        for item in items:
            if not -len(self) <= item < len(self):
                raise IndexError(f"item {item} out of range for a split of {len(self)} samples")
        indices = [int(self.indices[item]) for item in items]
        out = []
        for index, raw in zip(indices, self.reader.read_many(indices)):
            x, y = self.sample(index, raw)
            out.append((torch.from_numpy(x), torch.from_numpy(np.asarray(y, dtype=np.int64))))
        return out

    def sample(self, index: int, raw) -> tuple[np.ndarray, np.ndarray]:
        """The item of global sample ``index`` from what the reader returned for it."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the open data files now (reading again reopens them); otherwise they close when the
        dataset is garbage-collected."""
        self.reader.close()


def _stats(manifest: Manifest, key: str, names: tuple | list, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of ``names`` under ``normalization[key]``, or 0 and 1 if not ``normalize``.

    A std of zero is refused, not floored: a constant channel cannot be standardised (its values
    minus the mean, divided by a tiny floor, would turn packing round-off into huge inputs). Such a
    channel carries no information; read it raw with ``normalize=False`` or drop it from the data.
    """
    entry = manifest.normalization.get(key)
    if entry is None or list(entry["names"]) != list(names):
        raise ShapeError(manifest.path, f"normalization[{key!r}] must list {list(names)}, got "
                                        f"{None if entry is None else entry['names']}")
    if not normalize:
        return np.zeros(len(names), np.float32), np.ones(len(names), np.float32)
    mean = np.asarray(entry["mean"], dtype=np.float32)
    std = np.asarray(entry["std"], dtype=np.float32)
    for name, value in zip(names, std):
        if not value > 0:
            raise MalformedFileError(manifest.path, f"normalization[{key!r}] has std {float(value)} for channel "
                                                    f"{name!r}: a constant channel cannot be standardised; load "
                                                    "with normalize=False or regenerate without that channel")
    return mean, std


class ClimateDataset(ManifestDataset):
    """Climate snapshots (netCDF4 from the generator, or DeepCAM HDF5 from the converter): x (C, H, W)."""

    def __init__(self, manifest, indices, info, normalize: bool, channel_indices: list[int] | None = None) -> None:
        super().__init__(manifest, indices, info)
        channels, height, width = manifest.sample_shape
        names = manifest.normalization["fields"]["names"]
        paths, counts = manifest.file_paths(), [f["samples"] for f in manifest.files]
        if manifest.kind == "climate-netcdf":
            self.reader = ClimateNetCDFReader(paths, counts, manifest.num_classes, names, height, width)
        else:
            stored = manifest.generator.get("stored_channels", channels) if channel_indices is not None else channels
            self.reader = DeepCAMReader(paths, counts, manifest.num_classes, height, width, stored, channel_indices)
        mean, std = _stats(manifest, "fields", names, normalize)
        self.mean, self.std = mean[:, None, None], std[:, None, None]

    def sample(self, index, raw):
        x, y = raw
        return (x - self.mean) / self.std, y


class HEPDataset(ManifestDataset):
    """HEP jets from one or more HDF5 files: jet images (1, H, W) or constituent rows (N, 5)."""

    def __init__(self, manifest, indices, info, features: str, normalize: bool) -> None:
        super().__init__(manifest, indices, info)
        if features not in HEP_FEATURES:
            raise ValueError(f"features must be one of {HEP_FEATURES}, got {features!r}")
        self.features = features
        shapes = manifest.sample_shape
        image_shape = tuple(shapes["images"])[1:]
        max_particles = shapes["constituents"][0]
        expected = {"images": (image_shape, FLOAT), "constituents": ((max_particles, 4), FLOAT),
                    "n_constituents": ((), INTEGER), "labels": ((), INTEGER), "jet_eta": ((), FLOAT),
                    "jet_phi": ((), FLOAT)}
        fields = HEP_FIELDS[features]
        self.reader = HDF5Reader(manifest.file_paths(), [f["samples"] for f in manifest.files],
                                 manifest.num_classes, expected, y_field="labels", fields=fields, units=HEP_UNITS)
        if features == "images":
            self.mean, self.std = _stats(manifest, "images", ["pt_fraction"], normalize)
        else:
            mean, std = _stats(manifest, "constituents", NORMALISED_FEATURES, normalize)
            self.mean = np.concatenate([mean, [0.0]]).astype(np.float32)  # the mask feature stays 0/1
            self.std = np.concatenate([std, [1.0]]).astype(np.float32)
        self.max_particles = max_particles

    def sample(self, index, row):
        if self.features == "images":
            x = (row["images"][None].astype(np.float32) - self.mean) / self.std
        else:
            count = int(row["n_constituents"])
            if not 0 <= count <= self.max_particles:
                path, file_row = self.reader.where(index)
                raise ValueRangeError(path, f"sample {file_row} has n_constituents {count}, expected 0 to "
                                            f"{self.max_particles} (the constituents rows per jet)")
            x = constituent_features(row["constituents"], count, float(row["jet_eta"]), float(row["jet_phi"]))
            x[:count] = (x[:count] - self.mean) / self.std  # padding rows stay exactly zero
        return x, row["labels"]


def _input_shape(manifest: Manifest, features: str | None) -> tuple:
    if manifest.kind == "hep-hdf5":
        if features == "images":
            return tuple(manifest.sample_shape["images"])
        return (manifest.sample_shape["constituents"][0], len(CONSTITUENT_FEATURES))
    return tuple(manifest.sample_shape)


def resolve(name_or_path: str | Path) -> Path:
    """The manifest path of a committed sample name, a data set directory, or a manifest file."""
    if str(name_or_path) in SAMPLE_NAMES:
        return sample_path(str(name_or_path))
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise MissingFileError(path, f"no such data set; give a directory with a manifest.json, a directory in "
                                     f"the MLPerf HPC DeepCAM layout (train/, validation/, stats.h5), one of the "
                                     f"committed samples {SAMPLE_NAMES}, or random data {tuple(RANDOM_DATASETS)}")
    return path


def load_dataset(name_or_path: str | Path, split: str = "train", *, features: str | None = None,
                 val_fraction: float = 0.2, split_seed: int = 0, normalize: bool = True, verify: bool = False,
                 channels: list[int] | None = None, **random_kw) -> torch.utils.data.Dataset:
    """Open a data set split.

    name_or_path: "climate-sample", "hep-sample", a random-data name ("random-imagenet",
        "random-deepcam", ...; for memory/speed runs only), a directory / manifest.json, or a
        directory in the MLPerf HPC DeepCAM layout (train/, validation/, stats.h5; no manifest:
        the splits are its folders, so ``val_fraction`` and ``split_seed`` do not apply).
    features: for HEP, "images" (default) or "constituents".
    channels: for the DeepCAM layout, the channel indices to read (the reference's ``channels``).
    verify: check every file's sha256 against the manifest first (reads all files once).
    """
    if str(name_or_path) in RANDOM_DATASETS:
        return random_dataset(str(name_or_path), **random_kw)
    if random_kw:
        raise TypeError(f"unexpected arguments {sorted(random_kw)} for data set {name_or_path!r}")
    path = resolve(name_or_path)
    if not (path / "manifest.json").is_file() and is_deepcam_dir(path):
        return _load_deepcam_dir(path, split, features, normalize, verify, channels)
    if channels is not None:
        raise ValueError(f"channels= applies to directories in the DeepCAM layout only; {path} has a manifest")
    manifest = read_manifest(path)
    if verify:
        verify_checksums(manifest)
    else:
        manifest.check_sizes()
    hep = manifest.kind == "hep-hdf5"
    if hep:
        features = features or "images"
    elif features is not None:
        raise ValueError(f"features={features!r} applies to HEP data sets only; {manifest.path} is {manifest.kind}")
    indices = split_indices(manifest.count, split, val_fraction, time_ordered=not hep, seed=split_seed)
    info = {"task": manifest.task, "num_classes": manifest.num_classes, "class_names": manifest.class_names,
            "input_shape": _input_shape(manifest, features), "source": str(manifest.path), "kind": manifest.kind,
            "name": manifest.name, "split": split, "num_samples": len(indices), "random": False,
            "normalization": manifest.normalization if normalize else None}
    if hep:
        info["features"] = features
        if features == "constituents":
            info["feature_names"] = list(CONSTITUENT_FEATURES)
        return HEPDataset(manifest, indices, info, features, normalize)
    info["channels"] = list(manifest.normalization["fields"]["names"])
    return ClimateDataset(manifest, indices, info, normalize)


def _load_deepcam_dir(root: Path, split: str, features: str | None, normalize: bool, verify: bool,
                      channels: list[int] | None) -> ClimateDataset:
    """A split of a directory in the MLPerf HPC DeepCAM layout (``hpcdl.data.deepcam_dir``)."""
    if features is not None:
        raise ValueError(f"features={features!r} applies to HEP data sets only; {root} is a DeepCAM directory")
    if verify:
        raise ValueError(f"{root} is in the DeepCAM reference layout, which has no checksums to verify; "
                         "load it with verify=False (file sizes are still checked against what was listed)")
    manifest, selected = deepcam_manifest(root, split, channels)
    indices = np.arange(manifest.count)
    names = list(manifest.normalization["fields"]["names"])
    info = {"task": manifest.task, "num_classes": manifest.num_classes, "class_names": manifest.class_names,
            "input_shape": tuple(manifest.sample_shape), "source": str(root), "kind": "deepcam-dir",
            "name": manifest.name, "split": split, "num_samples": len(indices), "random": False,
            "normalization": manifest.normalization if normalize else None, "channels": names,
            "normalization_rule": "(x - minval) / (maxval - minval) from stats.h5"}
    return ClimateDataset(manifest, indices, info, normalize, selected)
