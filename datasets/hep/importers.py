"""Importers of public jet data sets into hpcdl's HEP layout (what ``generate_hep`` writes).

Each importer reads a foreign file and writes ``OUT/jets.h5`` (images, constituents (pT, eta, phi,
E), n_constituents, labels, jet_pt/eta/phi/mass, with ``units`` attributes) and ``OUT/manifest.json``
with the normalisation statistics, through the generator's :class:`JetWriter`. Jet images use the
generator's recipe (``preprocess.jet_image``) at radius 0.8 (both data sets are anti-kt R = 0.8 jets).

- **JetNet** (Kansal et al.; the ``jetnet`` package, files ``g.hdf5``, ``q.hdf5``, ``t.hdf5``,
  ``w.hdf5``, ``z.hdf5``, or ``t150.hdf5``... for 150 particles): one file per jet type, datasets
  ``particle_features`` (N, P, 4) = (etarel, phirel, ptrel, mask) and ``jet_features`` (N, 4) =
  (pt, eta, mass, num_particles); the type comes from the file name, as in ``jetnet``. Particles
  are rebuilt as pT = ptrel * jet pT, eta = etarel + jet eta, phi = phirel (JetNet keeps no jet
  phi: the jet axis is put at phi = 0) and E = pT cosh(eta) (JetNet's particles are massless).
  Give two or more types: the label is the type's index among those given, in JetNet's order.
- **Top tagging** (Kasieczka et al., "Top Quark Tagging Reference Dataset"): a pandas HDF5 store,
  key ``table``, columns E_i, PX_i, PY_i, PZ_i (i < 200, GeV, zero-padded), truthE/PX/PY/PZ, ttv,
  is_signal_new (1 top, 0 QCD). Read with h5py, not pandas (no pandas/PyTables in the base
  install): the published files use pandas' *fixed* format (``table/axis0`` the column names,
  ``table/blockK_items`` and ``blockK_values`` the columns of each dtype block); a *table*-format
  store is refused with how to rewrite it. Constituents are those with E > 0; the jet is the sum
  of their four-momenta. The truth top momentum and ``ttv`` (which published split a row came
  from) are not imported; the manifest records the ``ttv`` values seen.

Every HDF5 call of an import runs in hpcdl's I/O owner thread (``hpcdl.data.io_thread``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from hpcdl.data import io_thread
from hpcdl.data.errors import LabelRangeError, MalformedFileError, MissingFileError, ShapeError, ValueRangeError
from hpcdl.data.features import wrap_phi
from hpcdl.data.manifest import Manifest, sha256_of, write_manifest

from .generate import JetWriter
from .preprocess import JetParticles, constituent_array, jet_image

JET_RADIUS = 0.8
CHUNK_ROWS = 4096
#: JetNet's jet types, in its order, and the class name each gets.
JETNET_TYPES = {"g": "gluon", "t": "top", "q": "light_quark", "w": "w_boson", "z": "z_boson"}
TOP_TAGGING_CLASSES = ("qcd", "top")


def _open(path: Path):
    import h5py

    if not path.is_file():
        raise MissingFileError(path, "does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise MalformedFileError(path, f"cannot be read as HDF5 ({err})") from None


def jetnet_type(path: Path) -> str:
    """The jet type of a JetNet file from its name (``t.hdf5``, ``q150.hdf5``, ...)."""
    match = re.fullmatch(r"([gtqwz])(150)?", path.stem)
    if match is None:
        raise ValueError(f"{path}: a JetNet file is named by its jet type, one of {sorted(JETNET_TYPES)} "
                         "(g.hdf5, t.hdf5, ..., or t150.hdf5 for JetNet150); rename it")
    return match.group(1)


def _write(out: Path, name: str, class_names: list[str], max_particles: int, image_size: int, jets,
           generator: dict) -> Manifest:
    """Write ``jets`` (label, JetParticles, pt, eta, phi, mass) and the manifest (owner thread)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "jets.h5"
    writer = JetWriter(path, image_size, max_particles, class_names, f"hpcdl HEP jets imported from {name}",
                       str(generator))
    try:
        for label, particles, pt, eta, phi, mass in jets:
            rows, count = constituent_array(particles, max_particles)
            writer.append(jet_image(particles, image_size, JET_RADIUS), rows, count, label, pt, eta, phi, mass)
        if writer.count == 0:
            raise ValueError(f"no jets to import into {out}")
        normalization = writer.normalization()
        count = writer.count
    finally:
        writer.close()
    return write_manifest(out, name=name, kind="hep-hdf5", task="classification", class_names=class_names,
                          sample_shape={"images": [1, image_size, image_size], "constituents": [max_particles, 4]},
                          seed=0, generator=generator, files=[(path, count)], normalization=normalization,
                          extra={"command": f"hpcdl data import {name} ..."})


def import_jetnet(paths: list[str | Path], out_dir: str | Path, image_size: int = 32) -> Manifest:
    """Import JetNet files (one per jet type, two types or more) into ``out_dir``."""
    files = [Path(p) for p in paths]
    types = [jetnet_type(p) for p in files]
    if len(set(types)) < 2 or len(set(types)) != len(types):
        raise ValueError(f"give one JetNet file for each of two or more distinct jet types (a classifier needs "
                         f"two classes), got types {types}")
    order = [t for t in JETNET_TYPES if t in types]
    return io_thread.call(_import_jetnet, files, types, order, Path(out_dir), image_size)


def _jetnet_layout(path: Path, h5) -> tuple[int, int]:
    """(jets, particles per jet) of an open JetNet file, after checking its two datasets."""
    for name in ("particle_features", "jet_features"):
        if name not in h5:
            raise MalformedFileError(path, f"has no dataset {name!r}: a JetNet file holds particle_features "
                                           "(N, P, 4) and jet_features (N, 4)")
    particles, jets = h5["particle_features"], h5["jet_features"]
    if particles.ndim != 3 or particles.shape[2] != 4:
        raise ShapeError(path, f"particle_features has shape {particles.shape}, expected (N, P, 4) = "
                               "(etarel, phirel, ptrel, mask)")
    if jets.shape != (particles.shape[0], 4):
        raise ShapeError(path, f"jet_features has shape {jets.shape}, expected {(particles.shape[0], 4)} = "
                               "(pt, eta, mass, num_particles)")
    return particles.shape[0], particles.shape[1]


def _jetnet_jets(path: Path, h5, label: int):
    """(label, JetParticles, pt, eta, phi, mass) of every jet of an open JetNet file."""
    count, _ = _jetnet_layout(path, h5)
    for start in range(0, count, CHUNK_ROWS):
        particles = np.asarray(h5["particle_features"][start:start + CHUNK_ROWS], dtype=np.float64)
        jets = np.asarray(h5["jet_features"][start:start + CHUNK_ROWS], dtype=np.float64)
        for offset, (rows, (pt, eta, mass, _)) in enumerate(zip(particles, jets)):
            row = start + offset
            if not (np.isfinite(rows).all() and np.isfinite([pt, eta, mass]).all()):
                raise ValueRangeError(path, f"jet {row} has NaN or Inf features")
            real = rows[rows[:, 3] > 0.5]
            if len(real) == 0 or not pt > 0:
                raise ValueRangeError(path, f"jet {row} has {len(real)} particles and pt {pt}; every jet needs "
                                            "a positive pt and at least one particle (mask 1)")
            particle_pt = real[:, 2] * pt
            particle_eta = real[:, 0] + eta
            yield label, JetParticles(pt=particle_pt, eta=particle_eta, phi=wrap_phi(real[:, 1]),
                                      energy=particle_pt * np.cosh(particle_eta), jet_eta=eta, jet_phi=0.0), \
                pt, eta, 0.0, mass


def _import_jetnet(files: list[Path], types: list[str], order: list[str], out: Path, image_size: int) -> Manifest:
    handles = [_open(path) for path in files]
    try:
        widths = {_jetnet_layout(path, h5)[1] for path, h5 in zip(files, handles)}
        if len(widths) != 1:
            raise ShapeError(files[0], f"the files hold {sorted(widths)} particles per jet; give files of one "
                                       "JetNet variant (30 or 150 particles)")

        def jets():
            for path, h5, kind in zip(files, handles, types):
                yield from _jetnet_jets(path, h5, order.index(kind))

        generator = {"module": "hpcdl_datasets.hep.importers", "format": "jetnet",
                     "sources": [{"path": str(p), "jet_type": t, "sha256": sha256_of(p)} for p, t in zip(files, types)],
                     "jet_phi": "0 (JetNet stores positions relative to the jet axis)", "image_size": image_size}
        return _write(out, "jetnet", [JETNET_TYPES[t] for t in order], widths.pop(), image_size, jets(), generator)
    finally:
        for h5 in handles:
            h5.close()


def import_top_tagging(path: str | Path, out_dir: str | Path, image_size: int = 32, key: str = "table",
                       max_jets: int | None = None) -> Manifest:
    """Import a top-tagging reference file (pandas fixed-format HDF5) into ``out_dir``."""
    if max_jets is not None and max_jets < 1:
        raise ValueError(f"max_jets must be at least 1, got {max_jets}")
    return io_thread.call(_import_top_tagging, Path(path), Path(out_dir), image_size, key, max_jets)


def pandas_fixed_columns(path: Path, h5, key: str) -> dict[str, tuple[str, int]]:
    """Column name -> (values dataset, column index) of the pandas fixed-format frame under ``key``."""
    if key not in h5:
        raise MalformedFileError(path, f"has no pandas frame {key!r} (has {sorted(h5)}); the top-tagging files "
                                       "store theirs under 'table'")
    group = h5[key]
    if "table" in group and "block0_items" not in group:
        raise MalformedFileError(path, f"{key!r} is a pandas table-format store; hpcdl reads the fixed format the "
                                       "published files use: rewrite it with pandas, pd.read_hdf(path, "
                                       f"'{key}').to_hdf(new_path, key='{key}', format='fixed')")
    columns: dict[str, tuple[str, int]] = {}
    block = 0
    while f"block{block}_items" in group:
        for index, name in enumerate(group[f"block{block}_items"][...]):
            columns[name.decode() if isinstance(name, bytes) else str(name)] = (f"{key}/block{block}_values", index)
        block += 1
    if not columns:
        raise MalformedFileError(path, f"{key!r} has no block0_items/block0_values: not a pandas fixed-format frame")
    return columns


def _import_top_tagging(path: Path, out: Path, image_size: int, key: str, max_jets: int | None) -> Manifest:
    h5 = _open(path)
    try:
        columns = pandas_fixed_columns(path, h5, key)
        particles = 0
        while all(f"{part}_{particles}" in columns for part in ("E", "PX", "PY", "PZ")):
            particles += 1
        missing = [name for name in ("E_0", "PX_0", "PY_0", "PZ_0", "is_signal_new") if name not in columns]
        if missing:
            raise MalformedFileError(path, f"frame {key!r} lacks the columns {missing}; the top-tagging layout "
                                           "has E_i, PX_i, PY_i, PZ_i and is_signal_new")
        blocks = sorted({dataset for dataset, _ in columns.values()})
        total = h5[blocks[0]].shape[0]
        count = total if max_jets is None else min(total, max_jets)
        ttv_seen: set[int] = set()

        def take(values: dict, name: str) -> np.ndarray:
            dataset, index = columns[name]
            return values[dataset][:, index]

        def jets():
            for start in range(0, count, CHUNK_ROWS):
                stop = min(start + CHUNK_ROWS, count)
                values = {dataset: np.asarray(h5[dataset][start:stop]) for dataset in blocks}
                four = np.stack([np.stack([take(values, f"{part}_{i}") for i in range(particles)], axis=1)
                                 for part in ("E", "PX", "PY", "PZ")], axis=2).astype(np.float64)  # (n, M, 4)
                labels = take(values, "is_signal_new")
                if "ttv" in columns:
                    ttv_seen.update(int(v) for v in np.unique(take(values, "ttv")))
                    generator["ttv"] = sorted(ttv_seen)  # read into the manifest after the last jet
                for offset, (rows, label) in enumerate(zip(four, labels)):
                    row = start + offset
                    if not np.isfinite(rows).all():
                        raise ValueRangeError(path, f"jet {row} has NaN or Inf momenta")
                    if label not in (0, 1):
                        raise LabelRangeError(path, f"jet {row} has is_signal_new {label}, expected 0 or 1")
                    real = rows[rows[:, 0] > 0]
                    pt = np.hypot(real[:, 1], real[:, 2])
                    real, pt = real[pt > 0], pt[pt > 0]
                    if len(real) == 0:
                        raise ValueRangeError(path, f"jet {row} has no constituent with E > 0 and pT > 0")
                    energy, px, py, pz = real.sum(axis=0)
                    jet_pt = float(np.hypot(px, py))
                    jet_eta = float(np.arcsinh(pz / jet_pt))
                    jet_phi = float(np.arctan2(py, px))
                    mass = float(np.sqrt(max(energy**2 - px**2 - py**2 - pz**2, 0.0)))
                    parts = JetParticles(pt=pt, eta=np.arcsinh(real[:, 3] / pt), phi=np.arctan2(real[:, 2], real[:, 1]),
                                         energy=real[:, 0], jet_eta=jet_eta, jet_phi=jet_phi)
                    yield int(label), parts, jet_pt, jet_eta, jet_phi, mass

        generator = {"module": "hpcdl_datasets.hep.importers", "format": "top-tagging (pandas fixed)",
                     "sources": [{"path": str(path), "key": key, "sha256": sha256_of(path), "rows": total,
                                  "imported": count}],
                     "units": "GeV (as published)", "image_size": image_size, "ttv": []}
        manifest = _write(out, "top-tagging", list(TOP_TAGGING_CLASSES), particles, image_size, jets(), generator)
    finally:
        h5.close()
    return manifest
