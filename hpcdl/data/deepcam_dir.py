"""A directory in the MLPerf HPC DeepCAM reference layout, read with no manifest.

The layout (mlcommons/hpc, ``deepcam/src/deepCam/data``)::

    DIR/train/*.h5          one sample per file: climate/data (H, W, C) float, climate/labels_0 (H, W)
    DIR/validation/*.h5     the same, the validation split
    DIR/stats.h5            climate/minval, climate/maxval: (C,) per channel

The reference reads the files of a split folder in sorted name order and normalises
``x' = (x - minval) / (maxval - minval)`` with the stats of the selected channels; this module
turns that into an in-memory :class:`Manifest` of one split whose ``normalization`` holds
``mean = minval`` and ``std = maxval - minval`` (the loaders subtract and divide), so the split is
read by the same ``ClimateDataset`` and ``DeepCAMReader`` as a manifest data set. File sizes are
recorded for the truncation check; there are no checksums (``verify=True`` is refused).
``stats.h5`` may name its channels in an attribute ``channel_names`` of ``climate`` (hpcdl's
converter writes it); otherwise they are ``channel_0``, ``channel_1``, ...

stats.h5 and the sample files are opened only in the I/O owner thread (``io_thread``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import io_thread
from .errors import MalformedFileError, MissingFileError, ShapeError
from .manifest import Manifest
from .readers import library_error, open_hdf5

SPLIT_FOLDERS = {"train": ("train",), "val": ("validation",), "all": ("train", "validation")}
STATS_NAME = "stats.h5"
#: DeepCAM's classes, in its label order.
CLASS_NAMES = ("background", "tropical_cyclone", "atmospheric_river")


def is_deepcam_dir(path: Path) -> bool:
    """Whether ``path`` looks like the reference layout: a directory with train/ and validation/ folders
    or a stats.h5 (what is missing of the rest is then a named error)."""
    return path.is_dir() and ((path / STATS_NAME).is_file() or
                              ((path / "train").is_dir() and (path / "validation").is_dir()))


def _read_stats(path: Path) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """(minval, maxval, channel names or None) of stats.h5 (runs in the owner thread)."""
    handle = open_hdf5(path)
    try:
        for key in ("climate/minval", "climate/maxval"):
            if key not in handle:
                raise MalformedFileError(path, f"has no dataset {key!r}: the DeepCAM stats file needs "
                                               "climate/minval and climate/maxval, one value per channel")
        try:
            low = np.asarray(handle["climate/minval"][...], dtype=np.float64)
            high = np.asarray(handle["climate/maxval"][...], dtype=np.float64)
            names = handle.file["climate"].attrs.get("channel_names")
        except Exception as err:
            error = library_error(path, err, "HDF5")
        else:
            return low, high, None if names is None else [str(n.decode() if isinstance(n, bytes) else n)
                                                          for n in names]
        raise error
    finally:
        handle.close()


def _peek_shape(path: Path) -> tuple[int, ...]:
    """The ``climate/data`` shape of one sample file (runs in the owner thread)."""
    handle = open_hdf5(path)
    try:
        if "climate/data" not in handle:
            raise MalformedFileError(path, "has no dataset 'climate/data' (the DeepCAM sample layout)")
        return tuple(handle["climate/data"].shape)
    finally:
        handle.close()


def deepcam_manifest(root: Path, split: str, channels: list[int] | None = None) -> tuple[Manifest, list[int] | None]:
    """An in-memory manifest of ``split`` ("train", "val" or "all") of the reference layout at ``root``,
    and the channel indices to select (None: all)."""
    if split not in SPLIT_FOLDERS:
        raise ValueError(f"split must be one of {tuple(SPLIT_FOLDERS)}, got {split!r}")
    files: list[Path] = []
    for folder in SPLIT_FOLDERS[split]:
        directory = root / folder
        if not directory.is_dir():
            raise MissingFileError(directory, f"has no {folder}/ folder: the DeepCAM layout holds train/*.h5 and "
                                              "validation/*.h5 beside stats.h5")
        found = sorted(directory.glob("*.h5"))
        if not found:
            raise MissingFileError(directory, "holds no *.h5 sample files")
        files += found
    if not (root / STATS_NAME).is_file():
        raise MissingFileError(root / STATS_NAME, "does not exist: the DeepCAM layout keeps the per-channel "
                                                  "climate/minval and climate/maxval in stats.h5 beside train/")
    low, high, names = io_thread.call(_read_stats, root / STATS_NAME)
    shape = io_thread.call(_peek_shape, files[0])
    if len(shape) != 3:
        raise ShapeError(files[0], f"dataset 'climate/data' has shape {shape}, expected (H, W, C)")
    height, width, stored = shape
    stats_path = root / STATS_NAME
    if low.shape != (stored,) or high.shape != (stored,):
        raise ShapeError(stats_path, f"climate/minval and maxval have shapes {low.shape} and {high.shape}, "
                                     f"expected ({stored},): one value per channel of {files[0]}")
    names = names if names is not None and len(names) == stored else [f"channel_{i}" for i in range(stored)]
    selected = list(range(stored)) if channels is None else [int(c) for c in channels]
    bad = [c for c in selected if not 0 <= c < stored]
    if bad or not selected or len(set(selected)) != len(selected):
        raise ValueError(f"channels must be distinct indices in [0, {stored}), got {channels}")
    low, high = low[selected], high[selected]
    flat = [names[c] for c, lo, hi in zip(selected, low, high) if not hi > lo]
    if flat or not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise MalformedFileError(stats_path, f"maxval must exceed minval (both finite) for every channel; "
                                             f"not so for {flat or 'a non-finite value'}")
    normalization = {"fields": {"names": [names[c] for c in selected], "mean": low.tolist(),
                                "std": (high - low).tolist()}}
    entries = [{"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size, "sha256": None,
                "samples": 1} for path in files]
    manifest = Manifest(root=root, name=root.name, kind="deepcam-hdf5", task="segmentation",
                        num_classes=len(CLASS_NAMES), class_names=list(CLASS_NAMES),
                        sample_shape=[len(selected), height, width], count=len(files), seed=0,
                        generator={"layout": "mlcommons-deepcam", "stats": str(stats_path), "channels": selected,
                                   "stored_channels": stored},
                        files=entries, normalization=normalization)
    return manifest, None if channels is None else selected
