"""Shared test helpers.

Tests that need a service (mpirun, Slurm, Horovod) skip when it is absent on a
developer's machine, but fail under ``HPCDL_REQUIRE_SERVICES=1`` (set by
``tools/test.sh`` in CI), so CI can never pass by skipping them.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

# Hypothesis example counts: "ci" is what `bash tools/test.sh` (CI's test command) selects through
# HPCDL_HYPOTHESIS_PROFILE; a bare `pytest` gets "dev" (or "ci" where the CI variable is set).
settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HPCDL_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def require(condition: bool, reason: str) -> None:
    """Skip (or, under HPCDL_REQUIRE_SERVICES=1, fail) when ``condition`` is false."""
    if condition:
        return
    if os.environ.get("HPCDL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required in CI but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture
def one_thread():
    """Run on one torch thread (measuring subprocesses inherit it).

    On a shared, oversubscribed CPU the OpenMP barriers of small ops make two
    threads many times slower than one; results do not depend on it.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
