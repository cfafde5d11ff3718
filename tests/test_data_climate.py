"""Climate generator: determinism by seed, physics sanity, the TECA-like labels, the committed sample,
and the DeepCAM HDF5 converter round trip."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from hpcdl.data import load_dataset, read_manifest, verify_checksums
from hpcdl_datasets.climate import (
    CLASS_NAMES,
    ClimateSettings,
    LabelParams,
    MoistureParams,
    QGParams,
    TwoLayerQG,
    label_snapshot,
    simulate,
)
from hpcdl_datasets.climate.deepcam import convert_to_deepcam
from hpcdl_datasets.climate.labels import AR, CYCLONE, connected_components

TINY = ClimateSettings(qg=QGParams(ny=16, nx=24, dt_s=1800.0), spinup_days=1.0, interval_hours=6.0)


def _run(seed):
    return [(t, x.copy(), y.copy()) for t, x, y in simulate(TINY, samples=3, seed=seed)]


def test_generator_is_deterministic_by_seed():
    first, again, other = _run(1), _run(1), _run(2)
    for (t1, x1, y1), (t2, x2, y2) in zip(first, again):
        assert t1 == t2 and np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert not np.array_equal(first[-1][1], other[-1][1])


def test_model_conserves_what_it_should():
    model = TwoLayerQG(QGParams(ny=32, nx=48, dt_s=1800.0), MoistureParams(), seed=0)
    for _ in range(50):
        model.step()
    fields = model.fields()
    psi = torch.fft.irfft2(model.streamfunction_h(), s=(32, 48))
    # Geostrophic winds are non-divergent and the eddy streamfunction has zero mean.
    div = torch.fft.irfft2(model.ik * torch.fft.rfft2(fields["u"]) + model.il * torch.fft.rfft2(fields["v"]), s=(32, 48))
    assert div.abs().max() < 1e-12 * fields["u"].abs().max() / model.dx
    assert psi.mean(dim=(1, 2)).abs().max() < 1e-6 * psi.abs().max()
    assert model.is_finite()
    # Humidity stays positive and below a generous multiple of saturation (semi-Lagrangian, monotone).
    assert fields["moisture"].min() > 0
    assert (fields["moisture"] <= 1.5 * model.m.saturation(fields["temperature"])).all()
    # The background temperature falls towards the pole (larger y).
    assert fields["temperature"][:4].mean() > fields["temperature"][-4:].mean() + 10


def test_labels_find_a_closed_cyclone_and_a_long_narrow_moist_band():
    ny, nx, dx_km = 64, 96, 62.5
    y, x = np.mgrid[0:ny, 0:nx].astype(float)
    r2 = (y - 40) ** 2 + (x - 20) ** 2
    height = -40.0 * np.exp(-r2 / (2 * 3.0**2))  # a deep, closed low
    vorticity = 5e-5 * np.exp(-r2 / (2 * 3.0**2))
    band = np.exp(-((y - 12 - 0.05 * x) ** 2) / (2 * 1.5**2)) * (x > 30) * (x < 90)  # ~3700 km long, narrow
    moisture = 0.004 + 0.016 * band
    u, v = np.zeros((ny, nx)), np.full((ny, nx), 15.0)  # AR transport is meridional, |q v|
    labels = label_snapshot(vorticity, height, moisture, u, v, dx_km, LabelParams(transport_min=0.16))
    assert set(np.unique(labels)) == {0, CYCLONE, AR}
    assert labels[40, 20] == CYCLONE and labels[12 + 3, 60] == AR
    assert labels[50, 60] == 0
    # An open trough (no closed contour within the radius) is not a cyclone.
    open_trough = -40.0 * np.exp(-((x - 20) ** 2) / (2 * 3.0**2))
    assert CYCLONE not in label_snapshot(vorticity, open_trough, moisture * 0, u, v, dx_km, LabelParams())
    # A short blob of high transport is not an AR.
    blob = 0.004 + 0.016 * np.exp(-((y - 12) ** 2 + (x - 60) ** 2) / (2 * 2.0**2))
    assert AR not in label_snapshot(vorticity * 0, height * 0, blob, u, v, dx_km, LabelParams(transport_min=0.16))


def test_connected_components_wrap_in_longitude():
    mask = np.zeros((5, 10), dtype=bool)
    mask[2, [0, 1, 8, 9]] = True
    assert len(connected_components(mask, periodic_x=True)) == 1
    assert len(connected_components(mask, periodic_x=False)) == 2


def test_committed_climate_sample_matches_its_manifest_and_covers_all_classes():
    data = load_dataset("climate-sample", "all", normalize=False)
    manifest = read_manifest(data.info["source"])
    assert verify_checksums(manifest) == len(manifest.files)
    assert manifest.class_names == list(CLASS_NAMES)
    assert min(manifest.extra["class_pixel_fraction"]) > 0.005
    present = np.zeros(3, dtype=np.int64)
    for i in range(0, len(data), 4):
        present += np.bincount(data[i][1].numpy().ravel(), minlength=3)
    assert (present > 0).all()


def test_deepcam_round_trip(tmp_path):
    from hpcdl_datasets.climate import generate_climate

    source = tmp_path / "climate"
    generate_climate(source, samples=5, seed=4, settings=TINY, progress=False)
    original = load_dataset(source, "all", normalize=False)
    out = convert_to_deepcam(source, tmp_path / "per-sample", progress=False)  # the MLPerf HPC reference layout
    assert sorted(p.name for p in out.iterdir()) == ["stats.h5", "train", "validation"]
    assert [p.name for p in sorted((out / "validation").iterdir())] == ["data-000004.h5"]  # last in time
    with h5py.File(out / "train" / "data-000003.h5") as h5:
        assert h5["climate/data"].shape == (16, 24, 6) and h5["climate/labels_0"].shape == (16, 24)
    with h5py.File(out / "stats.h5") as h5:
        assert h5["climate/minval"].shape == (6,) and h5["climate/maxval"].shape == (6,)
    converted = {split: load_dataset(out, split, normalize=False) for split in ("train", "val")}
    assert converted["train"].info["kind"] == "deepcam-dir" and len(converted["val"]) == 1
    for i in range(5):
        split, item = ("train", i) if i < 4 else ("val", 0)
        x, y = converted[split][item]
        assert torch.equal(x, original[i][0]) and torch.equal(y, original[i][1])
    out = tmp_path / "single"
    convert_to_deepcam(source, out, layout="single", progress=False)
    with h5py.File(out / "deepcam.h5") as h5:
        assert h5["data"].shape == (5, 16, 24, 6) and h5["data"].chunks == (1, 16, 24, 6)
    converted = load_dataset(out, "all", normalize=False)
    assert converted.info["kind"] == "deepcam-hdf5"
    for i in range(5):
        assert torch.equal(converted[i][0], original[i][0]) and torch.equal(converted[i][1], original[i][1])
    assert verify_checksums(read_manifest(out)) == 1
    with pytest.raises(ValueError, match="layout"):
        convert_to_deepcam(source, tmp_path / "x", layout="zarr")


def test_cli_make_verify_info_and_bad_input(tmp_path, capsys):
    from hpcdl.cli import main

    out = tmp_path / "made"
    assert main(["data", "make", "climate", "--samples", "2", "--grid", "8x12", "--out", str(out), "--no-progress"]) == 0
    manifest = read_manifest(out)
    assert manifest.count == 2 and manifest.sample_shape == [6, 8, 12] and manifest.seed == 0
    assert manifest.generator["settings"]["qg"]["ny"] == 8 and len(manifest.files[0]["sha256"]) == 64
    assert set(manifest.normalization["fields"]) == {"names", "mean", "std"}
    assert main(["data", "verify", str(out)]) == 0
    assert main(["data", "info", str(out)]) == 0
    assert "x (6, 8, 12) torch.float32" in capsys.readouterr().out
    assert main(["data", "make", "climate", "--samples", "0", "--out", str(out)]) == 2
    assert "--samples must be at least 1" in capsys.readouterr().err
    assert main(["data", "verify", str(tmp_path / "absent")]) == 2
    assert "no such data set" in capsys.readouterr().err
