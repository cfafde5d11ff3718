"""HEP data: jet-image and constituent preprocessing on FastJet jets built from constructed particles,
the HDF5 writer and loader, the Pythia-free import, and the committed sample (when present)."""

from __future__ import annotations

import importlib.util

import fastjet
import h5py
import numpy as np
import pytest
import torch

from hpcdl.data import (
    LabelRangeError,
    MalformedFileError,
    NonFiniteError,
    ShapeError,
    TruncatedFileError,
    ValueRangeError,
    load_dataset,
    read_manifest,
    verify_checksums,
)
from hpcdl.data.features import HEP_UNITS
from hpcdl.data.manifest import write_manifest
from hpcdl.data.readers import HDF5Reader
from hpcdl_datasets.hep import HEPSettings, JetParticles, centred_coordinates, constituent_array, jet_image
from hpcdl_datasets.hep.generate import CLASS_NAMES, JetWriter, import_pythia
from hpcdl_datasets.hep.preprocess import particles_of


def _pseudojet(pt, eta, phi):
    mass = 0.14
    px, py = pt * np.cos(phi), pt * np.sin(phi)
    pz = pt * np.sinh(eta)
    return fastjet.PseudoJet(px, py, pz, np.sqrt(px**2 + py**2 + pz**2 + mass**2))


def _two_prong_jet(rng, axis_eta=0.7, axis_phi=3.0, angle=0.9):
    """A W-like jet: a hard (250 GeV) and a soft (120 GeV) prong 0.4 apart, plus diffuse radiation,
    built in the jet's own frame and then rotated by ``angle`` and moved to (axis_eta, axis_phi)."""
    local, pts = [], []
    for offset, total in ((0.15, 250.0), (-0.25, 120.0)):
        for share in rng.dirichlet(np.ones(6)) * total:
            local.append(np.array([offset, 0.0]) + rng.normal(0, 0.01, 2))
            pts.append(share)
    for _ in range(10):
        local.append(rng.normal(0, 0.15, 2))
        pts.append(1.0)
    cos, sin = np.cos(angle), np.sin(angle)
    placed = np.array(local) @ np.array([[cos, sin], [-sin, cos]]) + [axis_eta, axis_phi]
    particles = [_pseudojet(pt, eta, phi) for pt, (eta, phi) in zip(pts, placed)]
    cluster = fastjet.ClusterSequence(particles, fastjet.JetDefinition(fastjet.antikt_algorithm, 0.8))
    jets = fastjet.sorted_by_pt(cluster.inclusive_jets(50.0))
    return jets[0], cluster


def test_jet_image_is_centred_rotated_and_flipped():
    rng = np.random.default_rng(0)
    for angle, axis_phi in ((0.9, 3.0), (-2.0, -3.1), (2.5, 0.2)):  # includes a jet across phi = +-pi
        jet, _cluster = _two_prong_jet(rng, angle=angle, axis_phi=axis_phi)
        particles = particles_of(jet)
        assert len(particles.pt) == 22
        coords = centred_coordinates(particles)
        weights = particles.pt / particles.pt.sum()
        assert np.allclose(weights @ coords, 0.0, atol=1e-9)  # centroid at the origin
        assert abs(weights @ (coords[:, 0] * coords[:, 1])) < 1e-9  # principal axes along eta and phi
        assert weights @ coords[:, 0] ** 2 > weights @ coords[:, 1] ** 2  # major axis along eta
        image = jet_image(particles, size=32, radius=0.8)
        assert image.shape == (32, 32) and image.dtype == np.float32
        assert abs(image.sum() - 1.0) < 1e-5  # every particle inside the window, pT fractions sum to 1
        rows, cols = np.nonzero(image > 0.05)
        assert set(rows) <= {15, 16}  # both prongs on the middle rows: the axis is horizontal
        hardest = np.unravel_index(np.argmax(image), image.shape)
        assert hardest[1] >= 16  # the hard prong sits to the right after the flip


def test_image_is_invariant_to_where_the_jet_points_and_to_its_orientation():
    base, _c1 = _two_prong_jet(np.random.default_rng(5), axis_eta=0.0, axis_phi=0.0, angle=0.3)
    moved, _c2 = _two_prong_jet(np.random.default_rng(5), axis_eta=-1.2, axis_phi=2.9, angle=2.0)
    first, second = jet_image(particles_of(base)), jet_image(particles_of(moved))
    assert np.abs(first - second).sum() < 0.05


def test_constituent_array_sorts_pads_and_truncates():
    particles = JetParticles(pt=np.array([5.0, 50.0, 20.0]), eta=np.array([0.1, 0.2, 0.3]),
                             phi=np.array([1.0, 1.1, 1.2]), energy=np.array([6.0, 60.0, 21.0]), jet_eta=0.2, jet_phi=1.1)
    rows, count = constituent_array(particles, max_particles=4)
    assert count == 3 and rows.shape == (4, 4)
    assert rows[:3, 0].tolist() == [50.0, 20.0, 5.0] and not rows[3].any()
    rows, count = constituent_array(particles, max_particles=2)
    assert count == 2 and rows[:, 0].tolist() == [50.0, 20.0]


@pytest.fixture(scope="module")
def hep_dir(tmp_path_factory):
    """A small HEP file of constructed jets written by the generator's writer: 12 jets, 2 classes."""
    out = tmp_path_factory.mktemp("hep")
    settings = HEPSettings(image_size=16, max_particles=32)
    writer = JetWriter(out / "jets.h5", settings.image_size, settings.max_particles, CLASS_NAMES, "test", "")
    rng = np.random.default_rng(1)
    keep = []
    for i in range(12):
        jet, cluster = _two_prong_jet(rng, angle=rng.uniform(-3, 3), axis_phi=rng.uniform(-3, 3))
        keep.append(cluster)
        particles = particles_of(jet)
        rows, count = constituent_array(particles, settings.max_particles)
        writer.append(jet_image(particles, settings.image_size), rows, count, i % 2, jet.pt(), jet.eta(),
                      jet.phi_std(), jet.m())
    normalization = writer.normalization()
    writer.close()
    write_manifest(out, name="hep", kind="hep-hdf5", task="classification", class_names=list(CLASS_NAMES),
                   sample_shape={"images": [1, 16, 16], "constituents": [32, 4]}, seed=0,
                   generator={"module": "test"}, files=[(out / "jets.h5", 12)], normalization=normalization)
    return out


def test_hep_loader_images_and_constituents(hep_dir):
    images = load_dataset(hep_dir, "train", features="images")
    val = load_dataset(hep_dir, "val", features="images")
    assert len(images) + len(val) == 12
    x, y = images[0]
    assert x.shape == (1, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64 and y.shape == ()
    assert images.info["input_shape"] == (1, 16, 16) and images.info["task"] == "classification"
    constituents = load_dataset(hep_dir, "all", features="constituents")
    x, y = constituents[3]
    assert x.shape == (32, 5) and constituents.info["feature_names"][-1] == "mask"
    count = int(x[:, 4].sum())
    assert count == 22 and not x[count:].any()  # padding rows are exactly zero
    stacked = torch.cat([constituents[i][0][:22, :4] for i in range(12)])
    assert torch.allclose(stacked.mean(dim=0), torch.zeros(4), atol=1e-4)  # normalised over real particles
    with h5py.File(hep_dir / "jets.h5") as h5:
        assert h5["images"].compression == "gzip" and h5["constituents"].chunks[0] == 256
        raw = load_dataset(hep_dir, "all", normalize=False)[5][0][0].numpy()
        assert np.array_equal(raw, h5["images"][5])
    with pytest.raises(ValueError, match="features must be one of"):
        load_dataset(hep_dir, features="towers")


def test_hep_loader_reads_only_the_fields_its_features_need(hep_dir):
    images = load_dataset(hep_dir, "all", features="images")
    constituents = load_dataset(hep_dir, "all", features="constituents")
    assert images.reader.fields == ["images", "labels"]
    assert sorted(constituents.reader.fields) == ["constituents", "jet_eta", "jet_phi", "labels", "n_constituents"]
    images[0]
    # The dataset object (and so its cache of decompressed chunks) stays open between reads.
    kept = images.reader.on_file(0, lambda h5: h5["images"] is h5["images"] and h5["images"].id.valid)
    assert kept
    with pytest.raises(ValueError, match="not among the expected datasets"):
        HDF5Reader(images.reader.paths, images.reader.counts, 2, {"labels": ((), "iu")}, y_field="labels",
                   fields=["jet_pt"])


def _damaged_copy(hep_dir, tmp_path, damage):
    """A copy of the HEP set with ``damage(path)`` applied to jets.h5 and the manifest rewritten to match,
    so that only the reader's own checks can catch it."""
    import shutil

    copy = tmp_path / "hep"
    shutil.copytree(hep_dir, copy)
    damage(copy / "jets.h5")
    manifest = read_manifest(copy)
    write_manifest(copy, name=manifest.name, kind=manifest.kind, task=manifest.task, class_names=manifest.class_names,
                   sample_shape=manifest.sample_shape, seed=0, generator={}, files=[(copy / "jets.h5", 12)],
                   normalization=manifest.normalization)
    return copy


def test_hep_label_out_of_range(hep_dir, tmp_path):
    def relabel(path):
        with h5py.File(path, "a") as h5:
            h5["labels"][4] = 5

    data = load_dataset(_damaged_copy(hep_dir, tmp_path, relabel), "all")
    with pytest.raises(LabelRangeError, match="jets.h5.*sample 4 has label 5"):
        data[4]


def test_hep_truncated_malformed_and_misshapen_files(hep_dir, tmp_path):
    def truncate(path):
        path.write_bytes(path.read_bytes()[:-5000])

    with pytest.raises(TruncatedFileError, match="jets.h5.*truncated"):
        load_dataset(_damaged_copy(hep_dir, tmp_path / "a", truncate))

    def drop_images(path):
        with h5py.File(path, "a") as h5:
            del h5["images"]

    with pytest.raises(MalformedFileError, match="jets.h5.*no dataset 'images'"):
        load_dataset(_damaged_copy(hep_dir, tmp_path / "b", drop_images))

    def reshape(path):
        with h5py.File(path, "a") as h5:
            del h5["constituents"]
            h5["constituents"] = np.zeros((12, 32, 3), np.float32)

    with pytest.raises(ShapeError, match="jets.h5.*'constituents' has shape \\(12, 32, 3\\)"):
        load_dataset(_damaged_copy(hep_dir, tmp_path / "c", reshape), features="constituents")


def test_generator_module_imports_without_pythia_and_says_what_to_install():
    if importlib.util.find_spec("pythia8mc") is not None:
        assert import_pythia().__name__ == "pythia8mc"
        return
    with pytest.raises(ImportError, match="pip install pythia8mc"):
        import_pythia()


def test_committed_hep_sample_matches_its_manifest():
    data = load_dataset("hep-sample", "all")
    manifest = read_manifest(data.info["source"])
    assert verify_checksums(manifest) == 1
    assert manifest.generator["settings"]["jet_radius"] == 0.8 and manifest.count == 3000
    with h5py.File(manifest.file_paths()[0]) as h5:
        labels, mass, pt = h5["labels"][:], h5["jet_mass"][:], h5["jet_pt"][:]
    assert set(np.unique(labels)) == {0, 1} and labels.mean() == 0.5
    assert pt.min() >= 300 and pt.max() < 400
    # Physics: W jets peak near the W mass; QCD jets are lighter.
    assert 75 < np.median(mass[labels == 1]) < 92 and np.median(mass[labels == 0]) < 70
    x, y = load_dataset("hep-sample", "val", features="constituents")[0]
    assert x.shape == (64, 5) and y.dtype == torch.int64


def test_committed_hep_validation_prefix_mixes_both_classes():
    """The file holds the signal jets first: a capped evaluation (the first items only) must still see both
    classes, or AUC is undefined."""
    val = load_dataset("hep-sample", "val", features="images")
    prefix = [int(val[i][1]) for i in range(64)]
    assert 0.25 < np.mean(prefix) < 0.75
    train = load_dataset("hep-sample", "train", features="images")
    assert not set(train.indices) & set(val.indices) and len(train) + len(val) == 3000


def test_pythia_generator_makes_deterministic_w_and_qcd_jets(tmp_path):
    if importlib.util.find_spec("pythia8mc") is None:
        pytest.skip("pythia8mc (the [hep] extra) is not installed; the sample test above covers its output")
    from hpcdl_datasets.hep import generate_hep

    runs = []
    for name in ("a", "b"):
        manifest = generate_hep(tmp_path / name, samples=4, seed=11, progress=False)
        with h5py.File(manifest.file_paths()[0]) as h5:
            runs.append({key: h5[key][:] for key in ("images", "constituents", "labels", "jet_pt", "jet_mass")})
    assert manifest.count == 4 and sorted(runs[0]["labels"].tolist()) == [0, 0, 1, 1]
    assert ((runs[0]["jet_pt"] >= 300) & (runs[0]["jet_pt"] < 400)).all()
    for key in runs[0]:
        assert np.array_equal(runs[0][key], runs[1][key]), key


def _replace(name, values):
    """Replace dataset ``name`` by ``values``, keeping its attributes (its units)."""
    def damage(path):
        with h5py.File(path, "a") as h5:
            attributes = dict(h5[name].attrs)
            del h5[name]
            h5[name] = values
            h5[name].attrs.update(attributes)
    return damage


def test_committed_hep_sample_declares_the_units_the_generator_writes():
    with h5py.File(read_manifest(load_dataset("hep-sample", "all").info["source"]).file_paths()[0]) as h5:
        assert {name: h5[name].attrs["units"] for name in HEP_UNITS} == HEP_UNITS


def test_hep_dataset_without_units_is_refused_naming_the_attribute_to_set(hep_dir, tmp_path):
    def drop_units(path):
        with h5py.File(path, "a") as h5:
            del h5["images"].attrs["units"]

    with pytest.raises(MalformedFileError, match="jets.h5: dataset 'images' has no 'units' attribute, expected '1'"):
        load_dataset(_damaged_copy(hep_dir, tmp_path, drop_units))


def test_hep_wrong_dtype_out_of_range_count_and_nan_are_named(hep_dir, tmp_path):
    with h5py.File(hep_dir / "jets.h5") as h5:
        images, counts = h5["images"][...], h5["n_constituents"][...]
    with pytest.raises(ShapeError, match="jets.h5: dataset 'images' has dtype int32, expected a floating-point"):
        load_dataset(_damaged_copy(hep_dir, tmp_path / "a", _replace("images", images.astype(np.int32))))

    for bad in (-1, 33):
        wrong = counts.copy()
        wrong[7] = bad
        data = load_dataset(_damaged_copy(hep_dir, tmp_path / f"c{bad}", _replace("n_constituents", wrong)),
                            "all", features="constituents")
        data[6]
        with pytest.raises(ValueRangeError, match=f"jets.h5: sample 7 has n_constituents {bad}, expected 0 to 32"):
            data[7]

    poisoned = images.copy()
    poisoned[3, 2, 2] = np.nan
    data = load_dataset(_damaged_copy(hep_dir, tmp_path / "n", _replace("images", poisoned)), "all")
    with pytest.raises(NonFiniteError, match="jets.h5: sample 3 has 1 non-finite value.*'images'"):
        data[3]
