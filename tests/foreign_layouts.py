"""Writers of tiny files in foreign data layouts, for the tests of hpcdl's readers and importers.

Each writes what the public tools write, with h5py alone, in the layout their readers expect:

- ``write_deepcam_reference``: the MLPerf HPC DeepCAM reference layout (train/*.h5,
  validation/*.h5, stats.h5 with climate/minval and climate/maxval; one sample per file with
  climate/data (H, W, C) and climate/labels_0 (H, W)).
- ``write_jetnet``: JetNet's per-type files (``t.hdf5``, ``q.hdf5``): particle_features
  (N, P, 4) = (etarel, phirel, ptrel, mask), jet_features (N, 4) = (pt, eta, mass, num_particles).
- ``write_top_tagging``: the top-tagging reference data set as pandas writes it with
  ``df.to_hdf(path, key="table")`` (fixed format): table/axis0 (column names), table/axis1 (row
  index), one block per dtype (block0 float64 momenta, block1 int64 ttv and is_signal_new).

The data carry a learnable difference between the classes (tops wider and heavier than light
jets), so two training steps see both classes.

A small fixture of each layout is committed under ``tests/fixtures/foreign/`` (written by
``write_committed_fixtures``; 0.3 MiB in all), so the readers are proven on files in the repository,
not only on files written in the same test run. Regenerate them after a deliberate change here with::

    python tests/foreign_layouts.py

Datasets are written with ``track_times=False``: the same code writes the same bytes, and a
regeneration without a change leaves git clean.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "foreign"
TOP_TAGGING_FIXTURE_JETS = 24  # the committed top-tagging file; 200 particles x 4 float64 a jet make it the largest


def write_deepcam_reference(root: Path, train: int = 4, validation: int = 2, height: int = 16, width: int = 24,
                            channels: int = 4, seed: int = 0) -> Path:
    """A DeepCAM reference directory of ``train`` + ``validation`` samples at a small grid."""
    rng = np.random.default_rng(seed)
    scale = np.linspace(1.0, 1000.0, channels)  # channels of very different ranges, as DeepCAM's
    low, high = np.full(channels, np.inf), np.full(channels, -np.inf)
    for folder, count in (("train", train), ("validation", validation)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            data = (rng.normal(size=(height, width, channels)) * scale).astype(np.float32)
            labels = np.zeros((height, width), dtype=np.float32)  # the reference casts labels to int64
            labels[data[..., 0] > scale[0]] = 1
            labels[data[..., -1] < -scale[-1]] = 2
            with h5py.File(root / folder / f"data-2016-0{index + 1}-01-00-{folder[0]}.h5", "w") as h5:
                h5.create_dataset("climate/data", data=data, track_times=False)
                h5.create_dataset("climate/labels_0", data=labels, track_times=False)
            if folder == "train":
                low, high = np.minimum(low, data.min(axis=(0, 1))), np.maximum(high, data.max(axis=(0, 1)))
    with h5py.File(root / "stats.h5", "w") as h5:
        h5.create_dataset("climate/minval", data=low.astype(np.float32), track_times=False)
        h5.create_dataset("climate/maxval", data=high.astype(np.float32), track_times=False)
    return root


def _jets(rng, count: int, particles: int, top: bool) -> tuple[np.ndarray, np.ndarray]:
    """(particle (pt, eta, phi, E) rows (count, particles, 4), jet (pt, eta) (count, 2)) in GeV."""
    rows = np.zeros((count, particles, 4))
    axes = np.stack([rng.uniform(550, 650, count), rng.uniform(-1.5, 1.5, count)], axis=1)
    width = 0.35 if top else 0.1
    for jet in range(count):
        n = int(rng.integers(particles // 2, particles + 1))
        pt = rng.exponential(1.0, n) + 0.05
        pt = pt / pt.sum() * axes[jet, 0]
        eta = axes[jet, 1] + rng.normal(0, width, n)
        phi = rng.normal(0, width, n)
        rows[jet, :n] = np.stack([pt, eta, phi, pt * np.cosh(eta)], axis=1)
    return rows, axes


def write_jetnet(root: Path, jets: int = 24, particles: int = 30, seed: int = 0) -> list[Path]:
    """``t.hdf5`` and ``q.hdf5`` of ``jets`` jets each, in JetNet's layout."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in ("t", "q"):
        rows, axes = _jets(rng, jets, particles, top=kind == "t")
        mask = rows[:, :, 0] > 0
        features = np.zeros((jets, particles, 4), dtype=np.float32)
        features[..., 0] = np.where(mask, rows[..., 1] - axes[:, 1:2], 0)
        features[..., 1] = np.where(mask, rows[..., 2], 0)
        features[..., 2] = rows[..., 0] / axes[:, 0:1]
        features[..., 3] = mask
        px, py = (rows[..., 0] * np.cos(rows[..., 2])).sum(1), (rows[..., 0] * np.sin(rows[..., 2])).sum(1)
        pz, energy = (rows[..., 0] * np.sinh(rows[..., 1])).sum(1), rows[..., 3].sum(1)
        mass = np.sqrt(np.maximum(energy**2 - px**2 - py**2 - pz**2, 0))
        jet_features = np.stack([axes[:, 0], axes[:, 1], mass, mask.sum(1)], axis=1).astype(np.float32)
        path = root / f"{kind}.hdf5"
        with h5py.File(path, "w") as h5:
            h5.create_dataset("particle_features", data=features, track_times=False)
            h5.create_dataset("jet_features", data=jet_features, track_times=False)
        paths.append(path)
    return paths


def top_tagging_columns(particles: int) -> list[str]:
    """The reference data set's momentum column order: E_0, PX_0, PY_0, PZ_0, E_1, ..."""
    return [f"{part}_{i}" for i in range(particles) for part in ("E", "PX", "PY", "PZ")]


def write_top_tagging(path: Path, jets: int = 40, particles: int = 200, seed: int = 0) -> Path:
    """A top-tagging-like pandas fixed-format store of ``jets`` jets (half top), key ``table``."""
    rng = np.random.default_rng(seed)
    labels = np.arange(jets) % 2
    momenta = np.zeros((jets, particles * 4))
    truth = np.zeros((jets, 4))
    for label in (0, 1):
        rows, _ = _jets(rng, int((labels == label).sum()), particles // 4, top=bool(label))
        pt, eta, phi, energy = rows[..., 0], rows[..., 1], rows[..., 2], rows[..., 3]
        four = np.stack([energy, pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta)], axis=2)
        momenta[labels == label, : four.shape[1] * 4] = four.reshape(len(four), -1)
        if label:
            truth[labels == 1] = four.sum(axis=1)
    floats = np.concatenate([momenta, truth], axis=1)
    float_names = [*top_tagging_columns(particles), "truthE", "truthPX", "truthPY", "truthPZ"]
    ints = np.stack([np.zeros(jets, np.int64), labels.astype(np.int64)], axis=1)  # ttv 0 = train
    int_names = ["ttv", "is_signal_new"]
    with h5py.File(path, "w") as h5:
        group = h5.create_group("table")
        group.attrs.update({"pandas_type": "frame", "pandas_version": "0.15.2", "ndim": 2, "nblocks": 2})
        group.create_dataset("axis0", data=np.array(float_names + int_names, dtype="S"), track_times=False)
        group.create_dataset("axis1", data=np.arange(jets, dtype=np.int64), track_times=False)
        group.create_dataset("block0_items", data=np.array(float_names, dtype="S"), track_times=False)
        group.create_dataset("block0_values", data=floats, track_times=False)
        group.create_dataset("block1_items", data=np.array(int_names, dtype="S"), track_times=False)
        group.create_dataset("block1_values", data=ints, track_times=False)
    return path


def write_committed_fixtures(root: Path = FIXTURES) -> dict[str, Path]:
    """The committed fixtures under ``root``: ``deepcam/`` (the reference directory), ``jetnet/`` (t.hdf5,
    q.hdf5) and ``top_tagging/train.h5``, each at its writer's defaults (the top-tagging file with
    ``TOP_TAGGING_FIXTURE_JETS`` jets). Returns the path of each, by layout."""
    (root / "top_tagging").mkdir(parents=True, exist_ok=True)
    write_jetnet(root / "jetnet")
    return {"deepcam": write_deepcam_reference(root / "deepcam"), "jetnet": root / "jetnet",
            "top_tagging": write_top_tagging(root / "top_tagging" / "train.h5", jets=TOP_TAGGING_FIXTURE_JETS)}


if __name__ == "__main__":
    for layout, path in write_committed_fixtures().items():
        print(f"{layout}: {path}")
