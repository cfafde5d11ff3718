"""Convert a climate data set to the HDF5 layouts that DeepCAM (MLPerf HPC) users stage.

- ``per-sample`` (default): exactly the MLPerf HPC DeepCAM reference layout (mlcommons/hpc,
  ``deepcam/src/deepCam/data``)::

      OUT/train/data-NNNNNN.h5        climate/data (H, W, C) float32, climate/labels_0 (H, W) uint8
      OUT/validation/data-NNNNNN.h5   the same, the validation split
      OUT/stats.h5                    climate/minval, climate/maxval (C,) (what the reference
                                      normalises with), climate/mean, climate/std; attribute
                                      climate.channel_names

  The split is the source's own (the last ``val_fraction`` in time is validation); the stats are
  computed over the training split only, as the reference's stats are. No manifest is written:
  ``hpcdl.data.load_dataset(OUT)`` reads the layout as it stands, as the reference does.
- ``single``: one chunked file ``deepcam.h5`` with ``data`` (N, H, W, C) and ``labels`` (N, H, W),
  one sample per chunk, gzip-compressed, with a ``manifest.json`` (kind ``deepcam-hdf5``).

Labels use DeepCAM's class order: 0 background, 1 cyclone, 2 atmospheric river. Every HDF5 call
runs in hpcdl's I/O owner thread (``hpcdl.data.io_thread``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdl.data import io_thread
from hpcdl.data.datasets import load_dataset, split_indices
from hpcdl.data.manifest import Manifest, read_manifest, write_manifest

LAYOUTS = ("per-sample", "single")
SPLIT_FOLDERS = (("train", "train"), ("val", "validation"))


def convert_to_deepcam(source: str | Path, out_dir: str | Path, layout: str = "per-sample",
                       progress: bool = True, val_fraction: float = 0.2) -> Path:
    """Write every sample of the climate data set ``source`` (a name or directory) in a DeepCAM layout;
    returns the written directory (per-sample) or its manifest path (single)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    data = load_dataset(source, split="all", normalize=False)
    if data.info["kind"] != "climate-netcdf":
        raise ValueError(f"{source} is a {data.info['kind']} data set; the DeepCAM converter takes climate-netcdf")
    manifest = read_manifest(data.info["source"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if layout == "single":
            return io_thread.call(_write_single, data, manifest, out, progress).path
        return io_thread.call(_write_reference, data, manifest, out, progress, val_fraction)
    finally:
        data.close()


def _write_reference(data, manifest: Manifest, out: Path, progress: bool, val_fraction: float) -> Path:
    """The reference layout (runs in the I/O owner thread)."""
    import h5py
    from tqdm import tqdm

    channels = manifest.sample_shape[0]
    low, high = np.full(channels, np.inf), np.full(channels, -np.inf)
    total, square, pixels = np.zeros(channels), np.zeros(channels), 0
    for split, folder in SPLIT_FOLDERS:
        (out / folder).mkdir(exist_ok=True)
        indices = split_indices(len(data), split, val_fraction, time_ordered=True, seed=0)
        for index in tqdm(indices, unit="sample", desc=f"deepcam {folder}", disable=not progress):
            x, y = data[int(index)]
            hwc = x.numpy().transpose(1, 2, 0)
            with h5py.File(out / folder / f"data-{int(index):06d}.h5", "w") as h5:
                h5.create_dataset("climate/data", data=hwc)
                h5.create_dataset("climate/labels_0", data=y.numpy().astype(np.uint8))
            if split == "train":
                low, high = np.minimum(low, hwc.min(axis=(0, 1))), np.maximum(high, hwc.max(axis=(0, 1)))
                values = hwc.reshape(-1, channels).astype(np.float64)
                total, square, pixels = total + values.sum(0), square + (values**2).sum(0), pixels + len(values)
    mean = total / pixels
    std = np.sqrt(np.maximum(square / pixels - mean**2, 0.0))
    with h5py.File(out / "stats.h5", "w") as h5:
        for name, values in (("minval", low), ("maxval", high), ("mean", mean), ("std", std)):
            h5.create_dataset(f"climate/{name}", data=np.asarray(values, dtype=np.float32))
        h5["climate"].attrs["channel_names"] = list(manifest.normalization["fields"]["names"])
        h5["climate"].attrs["source"] = str(manifest.path)
    return out


def _write_single(data, manifest: Manifest, out: Path, progress: bool) -> Manifest:
    """One chunked file and a manifest (runs in the I/O owner thread)."""
    import h5py
    from tqdm import tqdm

    channels, height, width = manifest.sample_shape
    path = out / "deepcam.h5"
    options = {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    with h5py.File(path, "w") as single:
        single.create_dataset("data", (len(data), height, width, channels), "f4",
                              chunks=(1, height, width, channels), **options)
        single.create_dataset("labels", (len(data), height, width), "u1", chunks=(1, height, width), **options)
        for index in tqdm(range(len(data)), unit="sample", desc="deepcam", disable=not progress):
            x, y = data[index]
            single["data"][index] = x.numpy().transpose(1, 2, 0)
            single["labels"][index] = y.numpy().astype(np.uint8)
    return write_manifest(
        out, name=f"{manifest.name}-deepcam", kind="deepcam-hdf5", task=manifest.task,
        class_names=manifest.class_names, sample_shape=manifest.sample_shape, seed=manifest.seed,
        generator={"module": "hpcdl_datasets.climate.deepcam", "layout": "single", "source": str(manifest.path),
                   "source_generator": manifest.generator},
        files=[(path, len(data))], normalization=manifest.normalization)
