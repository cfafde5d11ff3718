"""The HDF5/netCDF I/O owner: every library call in one thread, handles closed by it, fork-safe,
and prefetch threads joined when an iteration stops early (issue 9's reader race)."""

from __future__ import annotations

import gc
import threading

import netCDF4
import pytest
import torch

from hpcdl.data import ShardedLoader, io_thread, load_dataset
from hpcdl.data import readers as readers_module


def test_every_netcdf_file_is_opened_and_closed_in_the_owner_thread(monkeypatch):
    opened, threads = [], set()
    real = netCDF4.Dataset

    def recording(*args, **kwargs):
        threads.add(threading.current_thread().name)
        opened.append(real(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(netCDF4, "Dataset", recording)
    gc.collect()  # an earlier test's dropped data sets post their closes now, and open_count runs after them
    before = io_thread.open_count()
    train, val = load_dataset("climate-sample", "train"), load_dataset("climate-sample", "val")
    for _, _ in zip(range(2), ShardedLoader(train, 4, prefetch=2)):  # the prefetch thread reads train
        val[0]  # while the main thread reads val
    train.close()
    del val
    gc.collect()  # val's finalizer only posts its close; the owner runs it before the next call
    assert io_thread.open_count() == before
    assert threads == {"hpcdl-hdf5-io"} and len(opened) >= 5
    assert not any(nc.isopen() for nc in opened)  # all closed by the owner: freeing them calls no library


def test_stopped_iteration_joins_its_prefetch_thread():
    data = load_dataset("hep-sample", "val")
    for _ in ShardedLoader(data, 8, prefetch=2):
        break
    assert not [t for t in threading.enumerate() if t.name == "hpcdl-prefetch"]
    data.close()


def test_forked_dataloader_workers_open_their_own_handles():
    data = load_dataset("hep-sample", "val", features="constituents")
    expected = torch.stack([data[i][0] for i in range(16)])  # the parent holds an open handle now
    workers = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(16)), batch_size=4, num_workers=2,
                                          multiprocessing_context="fork")
    assert torch.equal(torch.cat([x for x, _ in workers]), expected)
    assert data[3][0].equal(expected[3])  # the parent's handle still works after the children exited
    data.close()


def test_library_errors_reach_the_caller_as_named_errors():
    data = load_dataset("climate-sample", "val")
    with pytest.raises(readers_module.MalformedFileError, match="climate_0002.nc: sample 1 cannot be read"):
        data.reader.on_file(2, lambda nc: nc.variables["no such"][0], row=1)
    data.close()
