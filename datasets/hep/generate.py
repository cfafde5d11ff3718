"""The HEP data set generator: Pythia 8 events, FastJet anti-kt R = 0.8 jets, images and constituents.

Signal: hadronically decaying W bosons from ``f fbar -> W+ W-`` (both W forced to quarks) in pp
collisions at 13 TeV; a jet is signal if it contains a W's both decay quarks (Delta R < R) — a
boosted, two-prong jet with mass near 80 GeV. Background: QCD 2 -> 2 (``HardQCD:all``) jets. Both
samples are generated with a parton-level pT-hat window around the jet pT window (default jets
with 300 < pT < 400 GeV, |eta| < 2), with initial/final-state showers, multi-parton interactions
and hadronisation on; all visible final-state particles (no neutrinos) with |eta| < 5 enter the
clustering. One jet per event (the leading matched one) keeps the jets independent.

Output: one HDF5 file ``jets.h5`` (gzip level 4 + shuffle, chunked by 256 jets) with datasets
``images`` (N, S, S) pT fractions, ``constituents`` (N, M, 4) rows (pT, eta, phi, E),
``n_constituents`` (N,), ``labels`` (N,) 0 = QCD 1 = W, ``jet_pt``, ``jet_eta``, ``jet_phi``,
``jet_mass`` (N,), each with a ``units`` attribute, and ``manifest.json``.

Pythia 8 is the ``pythia8mc`` package (the ``[hep]`` extra); it is imported only when generating.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hpcdl.data import io_thread
from hpcdl.data.features import HEP_UNITS, NORMALISED_FEATURES, constituent_features
from hpcdl.data.manifest import Manifest, write_manifest

from .preprocess import constituent_array, jet_image, particles_of

CLASS_NAMES = ("qcd", "w_boson")
QUARK_IDS = (1, 2, 3, 4, 5)


@dataclass(frozen=True)
class HEPSettings:
    """Physics and preprocessing settings of the HEP generator."""

    sqrt_s_gev: float = 13000.0
    jet_radius: float = 0.8
    jet_pt_min: float = 300.0
    jet_pt_max: float = 400.0
    jet_eta_max: float = 2.0
    pthat_min: float = 250.0
    pthat_max: float = 450.0
    particle_eta_max: float = 5.0
    image_size: int = 32
    max_particles: int = 64
    multiparton_interactions: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def import_pythia():
    """The ``pythia8mc`` module, or an ImportError that says how to install it."""
    try:
        return importlib.import_module("pythia8mc")
    except ModuleNotFoundError:
        raise ImportError("the HEP generator needs Pythia 8's Python package: `pip install pythia8mc` "
                          "(or `pip install 'hpcdl[hep]'`; it builds from source, ~1 hour, if no wheel "
                          "fits), or install a prebuilt wheel with `pip install /path/to/pythia8mc-*.whl`") from None


def make_pythia(process: str, seed: int, settings: HEPSettings):
    """An initialised Pythia for "signal" (WW, W -> qq) or "background" (QCD dijets)."""
    pythia8 = import_pythia()
    pythia = pythia8.Pythia("", False)
    commands = [
        f"Beams:eCM = {settings.sqrt_s_gev}",
        f"PhaseSpace:pTHatMin = {settings.pthat_min}",
        f"PhaseSpace:pTHatMax = {settings.pthat_max}",
        "Random:setSeed = on",
        f"Random:seed = {seed % 900_000_000 + 1}",
        f"PartonLevel:MPI = {'on' if settings.multiparton_interactions else 'off'}",
        "Next:numberCount = 0",
        "Print:quiet = on",
    ]
    if process == "signal":
        commands += ["WeakDoubleBoson:ffbar2WW = on", "24:onMode = off",
                     "24:onIfAny = " + " ".join(str(q) for q in QUARK_IDS)]
    elif process == "background":
        commands += ["HardQCD:all = on"]
    else:
        raise ValueError(f"process must be 'signal' or 'background', got {process!r}")
    for command in commands:
        if not pythia.readString(command):
            raise RuntimeError(f"Pythia rejected the setting {command!r}")
    if not pythia.init():
        raise RuntimeError(f"Pythia failed to initialise the {process} process")
    return pythia


def _hadronic_w_quarks(event) -> list[list[tuple[float, float]]]:
    """(eta, phi) of the two decay quarks of each W that decays to quarks in the event record."""
    found = []
    for i in range(event.size()):
        particle = event[i]
        if particle.idAbs() != 24:
            continue
        d1, d2 = particle.daughter1(), particle.daughter2()
        if d1 <= 0 or d2 <= 0 or d2 - d1 != 1:
            continue
        quarks = [event[d1], event[d2]]
        if all(q.idAbs() in QUARK_IDS for q in quarks):
            found.append([(q.eta(), q.phi()) for q in quarks])
    return found


def _delta_r(eta1, phi1, eta2, phi2) -> float:
    dphi = (phi1 - phi2 + np.pi) % (2 * np.pi) - np.pi
    return float(np.hypot(eta1 - eta2, dphi))


def select_jet(pythia, fastjet, jet_definition, settings: HEPSettings, signal: bool):
    """The first jet of the current event in the pT/eta window (and, for signal, containing a W's quarks)."""
    event = pythia.event
    particles = []
    for i in range(event.size()):
        p = event[i]
        if p.isFinal() and p.isVisible() and abs(p.eta()) < settings.particle_eta_max:
            particles.append(fastjet.PseudoJet(p.px(), p.py(), p.pz(), p.e()))
    cluster = fastjet.ClusterSequence(particles, jet_definition)
    jets = [j for j in fastjet.sorted_by_pt(cluster.inclusive_jets(settings.jet_pt_min * 0.5))
            if settings.jet_pt_min <= j.pt() < settings.jet_pt_max and abs(j.eta()) < settings.jet_eta_max]
    w_quarks = _hadronic_w_quarks(event) if signal else []
    for jet in jets:
        if not signal or any(all(_delta_r(eta, phi, jet.eta(), jet.phi_std()) < settings.jet_radius
                                 for eta, phi in quarks) for quarks in w_quarks):
            return jet, cluster  # the cluster sequence owns the jet's constituents: keep it alive
    return None, cluster


class JetWriter:
    """Appends jets to a chunked, gzip-compressed HDF5 file in hpcdl's HEP layout (with ``units``
    attributes, :data:`hpcdl.data.features.HEP_UNITS`) and accumulates normalisation statistics.

    The generator and the importers of public data sets (``importers``) write through this one class.
    """

    def __init__(self, path: Path, image_size: int, max_particles: int, class_names: tuple | list,
                 title: str, settings: str) -> None:
        import h5py

        self.file = h5py.File(path, "w")
        s, m = image_size, max_particles
        options = {"compression": "gzip", "compression_opts": 4, "shuffle": True}
        self.datasets = {
            "images": self.file.create_dataset("images", (0, s, s), "f4", maxshape=(None, s, s), chunks=(256, s, s), **options),
            "constituents": self.file.create_dataset("constituents", (0, m, 4), "f4", maxshape=(None, m, 4),
                                                     chunks=(256, m, 4), **options),
            "n_constituents": self.file.create_dataset("n_constituents", (0,), "i2", maxshape=(None,), chunks=(256,), **options),
            "labels": self.file.create_dataset("labels", (0,), "i1", maxshape=(None,), chunks=(256,), **options),
        }
        for name in ("jet_pt", "jet_eta", "jet_phi", "jet_mass"):
            self.datasets[name] = self.file.create_dataset(name, (0,), "f4", maxshape=(None,), chunks=(256,), **options)
        self.datasets["constituents"].attrs["fields"] = "pt eta phi energy"
        for name, units in HEP_UNITS.items():
            self.datasets[name].attrs["units"] = units
        self.datasets["labels"].attrs["classes"] = " ".join(class_names)
        self.file.attrs.update({"title": title, "settings": settings})
        self.count = 0
        self.pixel_sum = self.pixel_square = 0.0
        self.feature_sum = np.zeros(len(NORMALISED_FEATURES))
        self.feature_square = np.zeros(len(NORMALISED_FEATURES))
        self.particles = 0

    def append(self, image: np.ndarray, constituents: np.ndarray, count: int, label: int, pt: float, eta: float,
               phi: float, mass: float) -> None:
        """One jet: its image, (M, 4) constituent rows (pT, eta, phi, E), their count, label and axis."""
        row = {"images": image, "constituents": constituents, "n_constituents": count, "labels": label,
               "jet_pt": pt, "jet_eta": eta, "jet_phi": phi, "jet_mass": mass}
        for name, value in row.items():
            dataset = self.datasets[name]
            dataset.resize(self.count + 1, axis=0)
            dataset[self.count] = value
        self.count += 1
        self.pixel_sum += float(image.sum(dtype=np.float64))
        self.pixel_square += float((image.astype(np.float64) ** 2).sum())
        features = constituent_features(constituents, count, eta, phi)[:count, :4].astype(np.float64)
        self.feature_sum += features.sum(axis=0)
        self.feature_square += (features**2).sum(axis=0)
        self.particles += count

    def normalization(self) -> dict:
        pixels = self.count * self.datasets["images"].shape[1] * self.datasets["images"].shape[2]
        pixel_mean = self.pixel_sum / pixels
        feature_mean = self.feature_sum / self.particles
        return {
            "images": {"names": ["pt_fraction"], "mean": [pixel_mean],
                       "std": [float(np.sqrt(max(self.pixel_square / pixels - pixel_mean**2, 0.0)))]},
            "constituents": {"names": list(NORMALISED_FEATURES), "mean": feature_mean.tolist(),
                             "std": np.sqrt(np.maximum(self.feature_square / self.particles - feature_mean**2,
                                                       0.0)).tolist()},
        }

    def close(self) -> None:
        self.file.close()


def generate_hep(out_dir: str | Path, samples: int = 6000, seed: int = 0, settings: HEPSettings | None = None,
                 progress: bool = True) -> Manifest:
    """Generate ``samples`` jets (half W, half QCD) into ``out_dir``/jets.h5 and write the manifest."""
    import fastjet
    from tqdm import tqdm

    if samples < 2:
        raise ValueError(f"samples must be at least 2 (half signal, half background), got {samples}")
    pythia_version = str(getattr(import_pythia(), "__version__", "unknown"))  # fail before writing anything
    settings = settings or HEPSettings()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jet_definition = fastjet.JetDefinition(fastjet.antikt_algorithm, settings.jet_radius)
    per_class = {1: samples // 2, 0: samples - samples // 2}
    path = out / "jets.h5"
    # Every HDF5 call runs in hpcdl's I/O owner thread (hpcdl.data.io_thread); Pythia and FastJet run here.
    writer = io_thread.call(JetWriter, path, settings.image_size, settings.max_particles, CLASS_NAMES,
                            "hpcdl HEP jets: Pythia 8 W -> qq vs QCD, FastJet anti-kt", str(settings.to_dict()))
    events = {0: 0, 1: 0}
    try:
        with tqdm(total=samples, unit="jet", desc="hep", disable=not progress) as bar:
            for label, process in ((1, "signal"), (0, "background")):
                pythia = make_pythia(process, seed * 2 + label, settings)
                produced = 0
                while produced < per_class[label]:
                    if not pythia.next():
                        continue
                    events[label] += 1
                    jet, _cluster = select_jet(pythia, fastjet, jet_definition, settings, signal=label == 1)
                    if jet is None:
                        continue
                    particles = particles_of(jet)
                    constituents, count = constituent_array(particles, settings.max_particles)
                    io_thread.call(writer.append, jet_image(particles, settings.image_size, settings.jet_radius),
                                   constituents, count, label, jet.pt(), jet.eta(), jet.phi_std(), jet.m())
                    produced += 1
                    bar.update(1)
        normalization = io_thread.call(writer.normalization)
    finally:
        io_thread.call(writer.close)
    return write_manifest(
        out, name="hep", kind="hep-hdf5", task="classification", class_names=list(CLASS_NAMES),
        sample_shape={"images": [1, settings.image_size, settings.image_size],
                      "constituents": [settings.max_particles, 4]},
        seed=seed, generator={"module": "hpcdl_datasets.hep", "settings": settings.to_dict(),
                              "events": {"background": events[0], "signal": events[1]},
                              "pythia": pythia_version},
        files=[(path, samples)], normalization=normalization,
        extra={"command": f"hpcdl data make hep --samples {samples} --seed {seed}"})
