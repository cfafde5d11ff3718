"""Loaders: shapes and dtypes, deterministic splits, rank shards, per-epoch shuffle, prefetch, exact
resume, random data, and a named error for every kind of bad file."""

from __future__ import annotations

import json
import shutil

import netCDF4
import numpy as np
import pytest
import torch

from hpcdl.data import (
    ChecksumError,
    DataError,
    LabelRangeError,
    MalformedFileError,
    MissingFileError,
    NonFiniteError,
    ShapeError,
    ShardedLoader,
    TruncatedFileError,
    io_thread,
    load_dataset,
    read_manifest,
    split_indices,
    verify_checksums,
)
from hpcdl.data.manifest import file_entry
from hpcdl_datasets.climate import ClimateSettings, QGParams, generate_climate

TINY = ClimateSettings(qg=QGParams(ny=16, nx=24, dt_s=1800.0), spinup_days=1.0, interval_hours=6.0,
                       samples_per_file=4)


def with_netcdf(path, use, mode="a"):
    """``use(nc)`` on ``path`` opened with netCDF4, in hpcdl's I/O owner thread, and its result.

    The netCDF/HDF5 library is not thread-safe, and the owner thread may be closing an earlier test's
    files at this moment: a test that opens a file itself must do it there too (docs/data.md)."""
    def run():
        with netCDF4.Dataset(path, mode) as nc:
            return use(nc)

    return io_thread.call(run)


@pytest.fixture(scope="module")
def climate_dir(tmp_path_factory):
    """A tiny generated climate data set: 10 snapshots of 16 x 24 in three netCDF files."""
    out = tmp_path_factory.mktemp("climate")
    generate_climate(out, samples=10, seed=3, settings=TINY, progress=False)
    return out


@pytest.fixture
def copy(climate_dir, tmp_path):
    """A private copy of the tiny data set, for tests that damage it."""
    target = tmp_path / "copy"
    shutil.copytree(climate_dir, target)
    return target


def _refresh_manifest(root, name):
    """Record a deliberately changed file's new size and checksum, so only the content check can catch it."""
    path = root / "manifest.json"
    body = json.loads(path.read_text())
    for entry in body["files"]:
        if entry["path"] == name:
            entry.update(file_entry(root, root / name, entry["samples"]))
    path.write_text(json.dumps(body))


class IndexDataset(torch.utils.data.Dataset):
    """Item i is (tensor(i), tensor(i)), so batches show which samples were read."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i), torch.tensor(i)


def _epoch(loader):
    return [int(v) for x, _ in loader for v in x]


def test_climate_items_have_the_declared_shapes_dtypes_and_normalisation(climate_dir):
    train = load_dataset(climate_dir, "train")
    val = load_dataset(climate_dir, "val")
    assert len(train) + len(val) == 10 and len(val) == 2
    x, y = train[0]
    assert x.shape == (6, 16, 24) and x.dtype == torch.float32
    assert y.shape == (16, 24) and y.dtype == torch.int64
    assert train.info["input_shape"] == (6, 16, 24) and train.info["num_classes"] == 3
    assert train.info["task"] == "segmentation" and train.info["channels"][0] == "vorticity"
    everything = torch.stack([load_dataset(climate_dir, "all")[i][0] for i in range(10)])
    # Normalised with the whole set's statistics: per channel mean ~0 and std ~1 over all samples.
    assert torch.allclose(everything.mean(dim=(0, 2, 3)), torch.zeros(6), atol=1e-3)
    assert torch.allclose(everything.std(dim=(0, 2, 3)), torch.ones(6), atol=1e-2)
    raw = load_dataset(climate_dir, "all", normalize=False)[0][0]
    def check(nc):
        assert np.allclose(raw[4].numpy(), nc.variables["temperature"][0], rtol=1e-6)
        assert nc.Conventions == "CF-1.8" and nc.variables["u"].standard_name == "eastward_wind"
        assert nc.variables["lat"].units == "degrees_north" and nc.variables["time"].dimensions == ("time",)

    with_netcdf(climate_dir / "climate_0000.nc", check, mode="r")


def test_splits_are_disjoint_cover_everything_and_are_deterministic():
    for time_ordered in (True, False):
        train = split_indices(50, "train", 0.2, time_ordered, seed=1)
        val = split_indices(50, "val", 0.2, time_ordered, seed=1)
        assert len(val) == 10 and not set(train) & set(val) and set(train) | set(val) == set(range(50))
        assert np.array_equal(val, split_indices(50, "val", 0.2, time_ordered, seed=1))
    assert list(split_indices(50, "val", 0.2, True, seed=0)) == list(range(40, 50))  # the last snapshots in time
    with pytest.raises(ValueError, match="split must be one of"):
        split_indices(5, "test", 0.2, True, 0)


@pytest.mark.parametrize("n, world", [(24, 2), (24, 3), (23, 4)])
def test_rank_shards_are_disjoint_and_cover_the_data(n, world):
    for drop_last in (True, False):
        shards = [_epoch(ShardedLoader(IndexDataset(n), 1, rank=r, world_size=world, seed=5, drop_last=drop_last))
                  for r in range(world)]
        assert len({len(s) for s in shards}) == 1  # equal shards: every rank takes the same number of steps
        seen = [i for s in shards for i in s]
        if drop_last:
            assert len(seen) == len(set(seen)) == n - n % world  # each at most once; the dropped tail < world
        else:
            assert set(seen) == set(range(n)) and len(seen) == -(-n // world) * world  # padded by wrapping
        if n % world == 0:
            assert sorted(seen) == list(range(n))  # exactly once per epoch


def test_shuffle_is_deterministic_per_epoch_and_changes_between_epochs():
    loader = ShardedLoader(IndexDataset(40), 4, seed=7)
    first = _epoch(loader)
    assert first == _epoch(ShardedLoader(IndexDataset(40), 4, seed=7))
    loader.set_epoch(1)
    second = _epoch(loader)
    assert sorted(first) == sorted(second) == list(range(40)) and first != second
    assert _epoch(ShardedLoader(IndexDataset(40), 4, seed=7, shuffle=False)) == list(range(40))


def test_batches_and_drop_last():
    assert [len(x) for x, _ in ShardedLoader(IndexDataset(10), 4, drop_last=True)] == [4, 4]
    assert [len(x) for x, _ in ShardedLoader(IndexDataset(10), 4, drop_last=False)] == [4, 4, 2]
    with pytest.raises(ValueError, match="rank"):
        ShardedLoader(IndexDataset(10), 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="no full batch"):
        ShardedLoader(IndexDataset(3), 2, world_size=2)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_resume_mid_epoch_continues_with_exactly_the_next_batch(prefetch):
    reference = ShardedLoader(IndexDataset(30), 3, rank=1, world_size=2, seed=2, prefetch=prefetch)
    reference.set_epoch(4)
    expected = _epoch(reference)
    interrupted = ShardedLoader(IndexDataset(30), 3, rank=1, world_size=2, seed=2, prefetch=prefetch)
    interrupted.set_epoch(4)
    consumed = []
    for x, _ in interrupted:
        consumed += x.tolist()
        if len(consumed) == 6:
            break
    state = interrupted.state_dict()
    assert state["epoch"] == 4 and state["position"] == 2
    resumed = ShardedLoader(IndexDataset(30), 3, rank=1, world_size=2, seed=2, prefetch=prefetch)
    resumed.load_state_dict(state)
    resumed.set_epoch(4)  # a training loop calls this again after restoring; it must keep the position
    assert consumed + _epoch(resumed) == expected
    assert _epoch(resumed) == expected  # the next pass is a whole epoch again
    with pytest.raises(ValueError, match="world_size"):
        ShardedLoader(IndexDataset(30), 3, world_size=1, seed=2).load_state_dict(state)


def test_prefetch_thread_passes_errors_to_the_training_loop():
    class Failing(IndexDataset):
        def __getitem__(self, i):
            if i == 5:
                raise LabelRangeError("file.nc", "sample 5 has label 9 outside [0, 3)")
            return super().__getitem__(i)

    with pytest.raises(LabelRangeError, match="label 9"):
        _epoch(ShardedLoader(Failing(8), 2, shuffle=False, prefetch=2))


def test_sharded_loader_reads_the_climate_files(climate_dir):
    data = load_dataset(climate_dir, "all")
    loader = ShardedLoader(data, 2, rank=0, world_size=2, seed=0)
    x, y = next(iter(loader))
    assert x.shape == (2, 6, 16, 24) and y.shape == (2, 16, 24)
    index = int(loader.shard_indices()[0])
    assert torch.equal(x[0], data[index][0])


def test_random_data_has_published_shapes_and_says_it_is_random():
    data = load_dataset("random-deepcam", length=2)
    assert data.info["input_shape"] == (16, 768, 1152) and data.info["random"] is True
    assert "accuracy" in data.info["note"]
    image = load_dataset("random-imagenet", length=3)
    x, y = image[2]
    assert x.shape == (3, 224, 224) and y.dtype == torch.int64 and 0 <= int(y) < 1000
    assert torch.equal(x, image[2][0])  # reproducible per item
    with pytest.raises(MissingFileError, match="no such data set.*random-imagenet"):
        load_dataset("random-mnist")


def test_missing_data_set_or_file(copy, tmp_path):
    with pytest.raises(MissingFileError, match="no such data set"):
        load_dataset(tmp_path / "nowhere")
    (copy / "climate_0001.nc").unlink()
    with pytest.raises(MissingFileError, match="climate_0001.nc.*does not exist"):
        load_dataset(copy)
    with pytest.raises(FileNotFoundError):  # also a FileNotFoundError, for callers that catch that
        load_dataset(copy)


def test_truncated_file(copy):
    path = copy / "climate_0002.nc"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TruncatedFileError, match="climate_0002.nc.*truncated"):
        load_dataset(copy)


def test_malformed_file_and_manifest(copy):
    (copy / "climate_0000.nc").write_bytes(b"this is not a netCDF file" * 100)
    _refresh_manifest(copy, "climate_0000.nc")
    with pytest.raises(MalformedFileError, match="climate_0000.nc.*cannot be read as netCDF4"):
        load_dataset(copy)
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(MalformedFileError, match="manifest.json.*not valid JSON"):
        load_dataset(copy)


def test_missing_variable(copy):
    path = copy / "climate_0001.nc"
    with_netcdf(path, lambda nc: nc.renameVariable("moisture", "humidity"))
    _refresh_manifest(copy, "climate_0001.nc")
    with pytest.raises(MalformedFileError, match="climate_0001.nc.*no variable 'moisture'"):
        load_dataset(copy)


def test_variable_with_wrong_shape(copy):
    path = copy / "climate_0000.nc"
    def edit(nc):
        nc.renameVariable("u", "u_old")
        nc.createDimension("lon2", 23)
        nc.createVariable("u", "f4", ("time", "lat", "lon2"))[:] = np.zeros((4, 16, 23), np.float32)

    with_netcdf(path, edit)
    _refresh_manifest(copy, "climate_0000.nc")
    with pytest.raises(ShapeError, match="climate_0000.nc.*'u' has dimensions"):
        load_dataset(copy)


def test_label_out_of_range(copy):
    path = copy / "climate_0002.nc"
    with_netcdf(path, lambda nc: nc.variables["labels"].__setitem__((1, 3, 4), 7))
    _refresh_manifest(copy, "climate_0002.nc")
    data = load_dataset(copy, "all")
    data[8]  # another sample of the same file is fine
    with pytest.raises(LabelRangeError, match="climate_0002.nc.*sample 1 has label 7 outside"):
        data[9]


def test_checksums_catch_changed_content(copy):
    assert verify_checksums(read_manifest(copy)) == 3
    path = copy / "climate_0001.nc"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="climate_0001.nc.*sha256"):
        load_dataset(copy, verify=True)


def _rewrite_variable(path, name, dtype, values, **attributes):
    """Replace variable ``name`` of a climate file with one of ``dtype`` holding ``values``."""
    def edit(nc):
        nc.renameVariable(name, f"{name}_old")
        var = nc.createVariable(name, dtype, ("time", "lat", "lon"))
        var.set_auto_maskandscale(False)
        for key, value in attributes.items():
            var.setncattr(key, value)
        var[:] = values

    with_netcdf(path, edit)


def test_nan_input_names_the_file_sample_and_variable(copy):
    path = copy / "climate_0001.nc"
    values = with_netcdf(path, lambda nc: np.array(nc.variables["u"][:], dtype=np.float32), mode="r")
    values[2, 5, 6] = np.nan
    values[2, 0, 0] = np.inf
    _rewrite_variable(path, "u", "f4", values)
    _refresh_manifest(copy, "climate_0001.nc")
    data = load_dataset(copy, "all")
    data[4]  # sample 0 of that file is fine
    with pytest.raises(NonFiniteError, match="climate_0001.nc: sample 2 has 2 non-finite value.*'u'"):
        data[6]


def test_wrongly_typed_variables_are_refused_with_expected_and_found(copy, climate_dir):
    path = copy / "climate_0000.nc"
    _rewrite_variable(path, "u", "i4", np.zeros((4, 16, 24), np.int32))
    _refresh_manifest(copy, "climate_0000.nc")
    with pytest.raises(ShapeError, match="climate_0000.nc: variable 'u' has dtype int32 without a scale_factor"):
        load_dataset(copy)
    packed = copy / "climate_0002.nc"
    _rewrite_variable(packed, "v", "i4", np.zeros((2, 16, 24), np.int32), scale_factor=0.5)  # CF packing is fine
    _refresh_manifest(copy, "climate_0002.nc")
    with pytest.raises(ShapeError, match="climate_0000.nc"):  # still only the unpacked int32 is refused
        load_dataset(copy)
    shutil.copy(climate_dir / "climate_0000.nc", path)
    _refresh_manifest(copy, "climate_0000.nc")
    _rewrite_variable(copy / "climate_0001.nc", "labels", "f4", np.zeros((4, 16, 24), np.float32))
    _refresh_manifest(copy, "climate_0001.nc")
    with pytest.raises(ShapeError, match="climate_0001.nc.*'labels' has dtype float32, expected an integer dtype"):
        load_dataset(copy)


def test_manifest_normalisation_problems_are_named(copy):
    path = copy / "manifest.json"
    body = json.loads(path.read_text())
    std = body["normalization"]["fields"]["std"]
    std[3] = 0.0
    path.write_text(json.dumps(body))
    name = body["normalization"]["fields"]["names"][3]
    with pytest.raises(MalformedFileError, match=f"manifest.json: normalization\\['fields'\\] has std 0.0 for "
                                                 f"channel '{name}'.*constant channel"):
        load_dataset(copy)
    assert load_dataset(copy, normalize=False)[0][0].shape == (6, 16, 24)  # raw values stay readable
    std[3] = float("nan")
    path.write_text(json.dumps(body))
    with pytest.raises(MalformedFileError, match="std of .* is nan, expected a finite number"):
        load_dataset(copy)
    del body["normalization"]["fields"]
    path.write_text(json.dumps(body))
    with pytest.raises(MalformedFileError, match="manifest.json: normalization lacks \\['fields'\\]"):
        load_dataset(copy)


def test_corrupted_metadata_is_a_named_error(copy):
    path = copy / "climate_0000.nc"
    data = bytearray(path.read_bytes())
    data[1500:1600] = bytes(range(100))  # inside the root group's object header
    path.write_bytes(bytes(data))
    _refresh_manifest(copy, "climate_0000.nc")
    with pytest.raises(DataError, match="climate_0000.nc"):
        load_dataset(copy, "all")[0]
