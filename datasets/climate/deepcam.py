"""Convert a climate data set to the HDF5 layout that DeepCAM (MLPerf HPC) users stage.

Two layouts:

- ``per-sample`` (DeepCAM's own): one ``data-NNNNNN.h5`` per sample holding ``climate/data``
  (H, W, C) float32 and ``climate/labels`` (H, W) uint8 (0 background, 1 cyclone, 2 AR — DeepCAM's
  class order), plus ``stats.h5`` with per-channel ``climate/minval``, ``maxval``, ``mean``, ``std``;
- ``single``: one chunked file ``deepcam.h5`` with ``data`` (N, H, W, C) and ``labels`` (N, H, W),
  one sample per chunk, gzip-compressed.

Both get a ``manifest.json`` (kind ``deepcam-hdf5``) so that ``hpcdl.data.load_dataset`` reads them.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from hpcdl.data.datasets import load_dataset
from hpcdl.data.manifest import Manifest, read_manifest, write_manifest

LAYOUTS = ("per-sample", "single")


def convert_to_deepcam(source: str | Path, out_dir: str | Path, layout: str = "per-sample",
                       progress: bool = True) -> Manifest:
    """Write every sample of the climate data set ``source`` (a name or directory) in DeepCAM layout."""
    from tqdm import tqdm

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    data = load_dataset(source, split="all", normalize=False)
    if data.info["kind"] != "climate-netcdf":
        raise ValueError(f"{source} is a {data.info['kind']} data set; the DeepCAM converter takes climate-netcdf")
    manifest = read_manifest(data.info["source"])
    channels, height, width = manifest.sample_shape
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[tuple[Path, int]] = []
    low = np.full(channels, np.inf)
    high = np.full(channels, -np.inf)
    single = None
    if layout == "single":
        path = out / "deepcam.h5"
        single = h5py.File(path, "w")
        options = {"compression": "gzip", "compression_opts": 4, "shuffle": True}
        single.create_dataset("data", (len(data), height, width, channels), "f4",
                              chunks=(1, height, width, channels), **options)
        single.create_dataset("labels", (len(data), height, width), "u1", chunks=(1, height, width), **options)
        files.append((path, len(data)))
    try:
        for index in tqdm(range(len(data)), unit="sample", desc="deepcam", disable=not progress):
            x, y = data[index]
            hwc = x.numpy().transpose(1, 2, 0)
            low = np.minimum(low, hwc.min(axis=(0, 1)))
            high = np.maximum(high, hwc.max(axis=(0, 1)))
            if single is not None:
                single["data"][index] = hwc
                single["labels"][index] = y.numpy().astype(np.uint8)
                continue
            path = out / f"data-{index:06d}.h5"
            with h5py.File(path, "w") as h5:
                h5.create_dataset("climate/data", data=hwc)
                h5.create_dataset("climate/labels", data=y.numpy().astype(np.uint8))
            files.append((path, 1))
    finally:
        if single is not None:
            single.close()
    stats = manifest.normalization["fields"]
    with h5py.File(out / "stats.h5", "w") as h5:
        for name, values in (("minval", low), ("maxval", high), ("mean", stats["mean"]), ("std", stats["std"])):
            h5.create_dataset(f"climate/{name}", data=np.asarray(values, dtype=np.float32))
    return write_manifest(
        out, name=f"{manifest.name}-deepcam", kind="deepcam-hdf5", task=manifest.task,
        class_names=manifest.class_names, sample_shape=manifest.sample_shape, seed=manifest.seed,
        generator={"module": "hpcdl_datasets.climate.deepcam", "layout": layout, "source": str(manifest.path),
                   "source_generator": manifest.generator},
        files=files, normalization=manifest.normalization)
