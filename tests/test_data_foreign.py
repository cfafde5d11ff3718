"""Foreign data layouts: the MLPerf HPC DeepCAM reference directory, JetNet and top-tagging HDF5.

The fixtures are committed under ``tests/fixtures/foreign/``, written by ``tests/foreign_layouts.py``
(h5py only, in each public tool's layout; ``python tests/foreign_layouts.py`` regenerates them, and a
test here requires that it writes the committed data); each is read, checked against what the public
reader computes, and trained on for two steps. Tests that damage a file write their own copy.
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from foreign_layouts import FIXTURES, TOP_TAGGING_FIXTURE_JETS, write_committed_fixtures, write_deepcam_reference

from hpcdl.data import DataError, MissingFileError, ShapeError, io_thread, load_dataset
from hpcdl.data.features import HEP_UNITS
from hpcdl.train import load_config, run_training
from hpcdl_datasets.hep.importers import import_jetnet, import_top_tagging

TRAIN = ["model.scale=tiny", "train.batch=2", "train.steps_per_epoch=1", "train.epochs=2", "logging.progress=false",
         "compression.method=none", "checkpoint.every_steps=0"]


def _read(path, *names):
    """``{name: array}`` of HDF5 datasets (``name@attr`` for an attribute), read in hpcdl's I/O owner
    thread: a test must not call the HDF5 library beside it (docs/data.md, the I/O owner)."""
    def read():
        with h5py.File(path) as h5:
            return {name: (h5[name.split("@")[0]].attrs[name.split("@")[1]] if "@" in name else h5[name][...])
                    for name in names}
    return io_thread.call(read)


def _train_two_steps(config: str, dataset, tmp_path, *extra):
    result = run_training(load_config(config, overrides=[f"data.dataset={dataset}", *TRAIN, *extra]),
                          run_dir=tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and result.final_val_metric is not None
    return result


def _reference_item(path, stats, channels=None):
    """A sample as the reference's CamDataset reads it: h5py, climate/data[..., channels], labels_0."""
    limits = _read(stats, "climate/minval", "climate/maxval")
    shift = limits["climate/minval"]
    scale = 1.0 / (limits["climate/maxval"] - shift)
    channels = list(range(len(shift))) if channels is None else channels
    sample = _read(path, "climate/data", "climate/labels_0")
    data = sample["climate/data"][..., channels]  # h5py itself takes increasing indices only
    label = sample["climate/labels_0"].astype(np.int64)
    data = scale[channels] * (data - shift[channels])
    return np.transpose(data, (2, 0, 1)), label


def _h5_contents(path) -> dict[str, object]:
    """Every dataset's array and every attribute of an HDF5 file, by name (``name@attr`` for attributes)."""
    contents: dict[str, object] = {}

    def visit(name, item):
        contents.update({f"{name}@{key}": value for key, value in item.attrs.items()})
        if isinstance(item, h5py.Dataset):
            contents[name] = item[...]

    with h5py.File(path) as h5:
        contents.update({f"@{key}": value for key, value in h5.attrs.items()})
        h5.visititems(visit)
    return contents


def test_committed_fixtures_are_what_the_generator_writes(tmp_path):
    """tests/fixtures/foreign/ holds exactly what ``write_committed_fixtures`` writes (same files, same
    arrays and attributes): the fixtures are reproducible, and a change to a writer without regenerating
    them (``python tests/foreign_layouts.py``) fails here. Floating arrays agree to 1e-12 of their values: numpy's
    transcendental functions (the jets' cosh, sin) differ by an ulp between CPUs and numpy builds."""
    write_committed_fixtures(tmp_path)
    committed = sorted(p.relative_to(FIXTURES) for p in FIXTURES.rglob("*") if p.is_file())
    assert committed == sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert sum((FIXTURES / name).stat().st_size for name in committed) < 512 * 1024
    for name in committed:
        fresh, kept = _h5_contents(tmp_path / name), _h5_contents(FIXTURES / name)
        assert sorted(fresh) == sorted(kept), name
        for key in fresh:
            made, stored = np.asarray(fresh[key]), np.asarray(kept[key])
            assert made.dtype == stored.dtype and made.shape == stored.shape, f"{name}: {key}"
            if made.dtype.kind == "f":
                assert np.allclose(made, stored, rtol=1e-12, atol=0, equal_nan=True), f"{name}: {key}"
            else:
                assert np.array_equal(made, stored), f"{name}: {key}"


@pytest.fixture(scope="module")
def deepcam_dir():
    return FIXTURES / "deepcam"  # read only


def test_deepcam_reference_directory_reads_as_the_reference_does(deepcam_dir):
    train, val = load_dataset(deepcam_dir, "train"), load_dataset(deepcam_dir, "val")
    assert (len(train), len(val), len(load_dataset(deepcam_dir, "all"))) == (4, 2, 6)
    assert train.info["input_shape"] == (4, 16, 24) and train.info["kind"] == "deepcam-dir"
    for split, folder in ((train, "train"), (val, "validation")):
        for item, path in enumerate(sorted((deepcam_dir / folder).glob("*.h5"))):  # the reference's order
            x, y = split[item]
            expected_x, expected_y = _reference_item(path, deepcam_dir / "stats.h5")
            assert torch.allclose(x, torch.from_numpy(expected_x).float(), rtol=1e-5, atol=1e-6)
            assert torch.equal(y, torch.from_numpy(expected_y)) and set(y.unique().tolist()) <= {0, 1, 2}
    picked = load_dataset(deepcam_dir, "val", channels=[3, 0])
    x, _ = picked[1]
    expected_x, _ = _reference_item(sorted((deepcam_dir / "validation").glob("*.h5"))[1], deepcam_dir / "stats.h5",
                                    [3, 0])
    assert x.shape == (2, 16, 24) and torch.allclose(x, torch.from_numpy(expected_x).float(), rtol=1e-5, atol=1e-6)
    assert picked.info["channels"] == ["channel_3", "channel_0"]


def test_deepcam_reference_directory_errors(deepcam_dir, tmp_path):
    with pytest.raises(ValueError, match="channels must be distinct"):
        load_dataset(deepcam_dir, "train", channels=[0, 9])
    with pytest.raises(ValueError, match="no checksums"):
        load_dataset(deepcam_dir, "train", verify=True)
    broken = write_deepcam_reference(tmp_path / "broken")
    (broken / "stats.h5").unlink()
    with pytest.raises(MissingFileError, match="minval"):
        load_dataset(broken, "train")
    with h5py.File(broken / "stats.h5", "w") as h5:
        h5.create_dataset("climate/minval", data=np.zeros(3, np.float32))
        h5.create_dataset("climate/maxval", data=np.ones(3, np.float32))
    with pytest.raises(ShapeError, match="one value per channel"):
        load_dataset(broken, "train")
    with h5py.File(broken / "stats.h5", "w") as h5:
        h5.create_dataset("climate/minval", data=np.zeros(4, np.float32))
        h5.create_dataset("climate/maxval", data=np.array([1, 1, 0, 1], np.float32))
    with pytest.raises(DataError, match="maxval must exceed minval"):
        load_dataset(broken, "train")


def test_trains_two_steps_on_a_deepcam_reference_directory(deepcam_dir, tmp_path):
    _train_two_steps("climate-deeplab", deepcam_dir, tmp_path)


def test_to_deepcam_writes_the_reference_layout(tmp_path):
    from hpcdl.cli import main
    from hpcdl_datasets.climate import ClimateSettings, QGParams, generate_climate

    source = tmp_path / "climate"
    generate_climate(source, samples=6, seed=2, progress=False,
                     settings=ClimateSettings(qg=QGParams(ny=16, nx=24, dt_s=1800.0), spinup_days=1.0,
                                              interval_hours=6.0))
    out = tmp_path / "deepcam"
    assert main(["data", "to-deepcam", str(source), "--out", str(out), "--no-progress", "--val-fraction", "0.34"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["stats.h5", "train", "validation"]  # no manifest
    files = {folder: sorted((out / folder).glob("*.h5")) for folder in ("train", "validation")}
    assert [len(files["train"]), len(files["validation"])] == [4, 2]
    original = load_dataset(source, "all", normalize=False)
    low, high = _read(out / "stats.h5", "climate/minval", "climate/maxval").values()
    for index, path in enumerate(files["train"] + files["validation"]):
        x, y = _reference_item(path, out / "stats.h5")
        raw, labels = original[index]
        assert np.array_equal(y, labels.numpy())
        np.testing.assert_allclose(x, (raw.numpy() - low[:, None, None]) / (high - low)[:, None, None], rtol=1e-5,
                                   atol=1e-6)
    train_raw = torch.stack([original[i][0] for i in range(4)])  # the stats are the training split's
    assert np.allclose(low, train_raw.amin(dim=(0, 2, 3)).numpy()) and np.allclose(high, train_raw.amax(dim=(0, 2, 3)).numpy())
    loaded = load_dataset(out, "val")
    assert loaded.info["channels"] == original.info["channels"] and len(loaded) == 2
    _train_two_steps("climate-deeplab", out, tmp_path)


@pytest.fixture(scope="module")
def jetnet(tmp_path_factory):
    paths = [FIXTURES / "jetnet" / "t.hdf5", FIXTURES / "jetnet" / "q.hdf5"]
    return paths, import_jetnet(paths, tmp_path_factory.mktemp("jetnet") / "imported")


def test_jetnet_import_rebuilds_the_particles(jetnet):
    paths, manifest = jetnet
    assert manifest.class_names == ["top", "light_quark"] and manifest.count == 48
    assert manifest.sample_shape == {"images": [1, 32, 32], "constituents": [30, 4]}
    with h5py.File(paths[0]) as h5:
        particles, jets = h5["particle_features"][...], h5["jet_features"][...]
    with h5py.File(manifest.file_paths()[0]) as h5:
        assert {name: h5[name].attrs["units"] for name in HEP_UNITS} == HEP_UNITS
        for jet in (0, 7):
            count = int(h5["n_constituents"][jet])
            assert count == int(particles[jet, :, 3].sum()) == int(jets[jet, 3]) and h5["labels"][jet] == 0
            rows = h5["constituents"][jet, :count]
            real = particles[jet][particles[jet, :, 3] > 0.5]
            order = np.argsort(-real[:, 2], kind="stable")
            np.testing.assert_allclose(rows[:, 0], real[order, 2] * jets[jet, 0], rtol=1e-5)
            np.testing.assert_allclose(rows[:, 1], real[order, 0] + jets[jet, 1], rtol=1e-5, atol=1e-5)
            assert np.isclose(h5["jet_pt"][jet], jets[jet, 0]) and np.isclose(h5["jet_mass"][jet], jets[jet, 2])
            assert np.isclose(h5["images"][jet].sum(), 1.0, atol=0.05)  # pT fractions (a few outside R)
        assert set(h5["labels"][...].tolist()) == {0, 1}
    x, y = load_dataset(manifest.root, "train", features="constituents")[0]
    assert x.shape == (30, 5) and y.item() in (0, 1)


def test_jetnet_import_errors(jetnet, tmp_path):
    paths, _ = jetnet
    with pytest.raises(ValueError, match="two or more distinct jet types"):
        import_jetnet(paths[:1], tmp_path / "x")
    renamed = tmp_path / "jets.hdf5"
    renamed.write_bytes(paths[0].read_bytes())
    with pytest.raises(ValueError, match="named by its jet type"):
        import_jetnet([renamed, paths[1]], tmp_path / "x")
    (tmp_path / "g.hdf5").write_bytes(b"not hdf5")
    with pytest.raises(DataError, match="cannot be read as HDF5"):
        import_jetnet([tmp_path / "g.hdf5", paths[1]], tmp_path / "x")


def test_trains_two_steps_on_imported_jetnet(jetnet, tmp_path):
    _train_two_steps("hep-jets", jetnet[1].root, tmp_path, "data.features=images")


@pytest.fixture(scope="module")
def top_tagging(tmp_path_factory):
    path = FIXTURES / "top_tagging" / "train.h5"
    return path, import_top_tagging(path, tmp_path_factory.mktemp("top") / "imported")


def test_top_tagging_import_reads_the_pandas_fixed_store(top_tagging):
    path, manifest = top_tagging
    assert manifest.class_names == ["qcd", "top"] and manifest.count == TOP_TAGGING_FIXTURE_JETS and manifest.generator["ttv"] == [0]
    with h5py.File(path) as h5:
        names = [n.decode() for n in h5["table/block0_items"][...]]
        values = h5["table/block0_values"][...]
        labels = h5["table/block1_values"][:, 1]
    column = {name: i for i, name in enumerate(names)}
    with h5py.File(manifest.file_paths()[0]) as h5:
        assert h5["labels"][...].tolist() == labels.tolist()
        for jet in (0, 5):
            energy = np.array([values[jet, column[f"E_{i}"]] for i in range(200)])
            px = np.array([values[jet, column[f"PX_{i}"]] for i in range(200)])
            py = np.array([values[jet, column[f"PY_{i}"]] for i in range(200)])
            count = int(h5["n_constituents"][jet])
            assert count == int((energy > 0).sum())
            np.testing.assert_allclose(np.sort(h5["constituents"][jet, :count, 0]),
                                       np.sort(np.hypot(px, py)[energy > 0]), rtol=1e-5)
            np.testing.assert_allclose(h5["constituents"][jet, :count, 3].sum(), energy.sum(), rtol=1e-5)
            assert np.isclose(h5["jet_pt"][jet], np.hypot(px.sum(), py.sum()), rtol=1e-5)
    assert load_dataset(manifest.root, "val", features="constituents")[0][0].shape == (200, 5)


def test_top_tagging_errors_and_units_are_checked(top_tagging, tmp_path):
    path, manifest = top_tagging
    table = tmp_path / "table.h5"
    with h5py.File(table, "w") as h5:
        h5.create_dataset("table/table", data=np.zeros(3))
    with pytest.raises(DataError, match="table-format"):
        import_top_tagging(table, tmp_path / "x")
    with pytest.raises(DataError, match="no pandas frame 'jets'"):
        import_top_tagging(path, tmp_path / "x", key="jets")
    copy = tmp_path / "copy"
    import_top_tagging(path, copy, max_jets=10)
    with h5py.File(copy / "jets.h5", "r+") as h5:
        h5["constituents"].attrs["units"] = "MeV 1 rad MeV"
    body = json.loads((copy / "manifest.json").read_text())
    body["files"][0]["bytes"] = (copy / "jets.h5").stat().st_size  # only the units differ
    (copy / "manifest.json").write_text(json.dumps(body))
    with pytest.raises(ShapeError, match="units 'MeV 1 rad MeV', expected 'GeV 1 rad GeV'"):
        load_dataset(copy, "train", features="constituents")


def test_cli_imports_and_trains_two_steps_on_top_tagging(top_tagging, tmp_path, capsys):
    from hpcdl.cli import main

    path, _ = top_tagging
    assert main(["data", "import", "top-tagging", str(path), "--out", str(tmp_path / "top"), "--image-size", "16"]) == 0
    assert f"imported {TOP_TAGGING_FIXTURE_JETS} jets" in capsys.readouterr().out
    assert main(["data", "import", "jetnet", str(path), "--out", str(tmp_path / "j")]) == 2  # not named t/q/...
    _train_two_steps("hep-particles", tmp_path / "top", tmp_path, "data.features=constituents")
