"""Fuzzing the readers with damaged copies of the committed sample files.

Every truncated or byte-corrupted copy of ``climate_0000.nc`` and ``jets.h5`` (with a manifest
rewritten to match, so only the readers can catch the damage) must either read fine or raise a
``DataError`` that names the file: never another exception type, never a crash. Each case runs in a
worker subprocess (tests/data_fuzz_worker.py), so a segfault fails the test instead of killing
pytest; after a crash the worker restarts at the next case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hpcdl.data.samples import sample_path

WORKER = Path(__file__).with_name("data_fuzz_worker.py")
FILES = [("climate-sample", "climate_0000.nc"), ("hep-sample", "jets.h5")]


def fuzz_cases(per_file: int, seed: int = 0) -> list[dict]:
    """``per_file`` cases per file: a third truncations, a third bytes corrupted in the first 4 KiB (where
    the superblock and the root object headers live), a third anywhere in the file."""
    rng = np.random.default_rng(seed)
    cases = []
    for sample, name in FILES:
        size = (sample_path(sample) / name).stat().st_size
        for i in range(per_file):
            kind = i % 3
            if kind == 0:
                at = [int(rng.integers(1, size))] if i % 2 else [int(rng.integers(1, 4096))]
                cases.append({"sample": sample, "file": name, "damage": "truncate", "at": at})
                continue
            limit = 4096 if kind == 1 else size
            at = sorted(int(o) for o in rng.integers(0, limit, int(rng.integers(1, 4))))
            cases.append({"sample": sample, "file": name, "damage": "bytes", "at": at,
                          "length": int(rng.choice([1, 4, 16, 64])), "seed": int(rng.integers(1 << 30))})
    return cases


def run_fuzz(cases: list[dict], tmp_path: Path, timeout_s: float) -> list[dict]:
    """Outcome per case; a case whose worker died gets "CRASH:<signal or code>", one that hung "HANG"."""
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outcomes: dict[int, dict] = {}
    first = 0
    while first < len(cases):
        started = None
        try:
            done = subprocess.run([sys.executable, str(WORKER), str(spec), str(first)], capture_output=True,
                                  text=True, timeout=timeout_s, env=env)
            stdout, stderr, code = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as err:
            stdout, stderr, code = (err.stdout or b"").decode(), "", None
        for line in stdout.splitlines():
            if line.startswith("start "):
                started = int(line.split()[1])
            elif line.startswith("{"):
                result = json.loads(line)
                outcomes[result["case"]] = result
        if started is None:  # the worker failed before its first case
            raise AssertionError(f"fuzz worker failed to start (code {code}): {stderr[-2000:]}")
        if started in outcomes:
            assert code == 0, f"fuzz worker exited with {code} after its last case"
            break
        outcomes[started] = {"case": started, "outcome": "HANG" if code is None else f"CRASH:{code}"}
        first = started + 1
    return [outcomes[i] for i in range(len(cases))]


def check(cases, outcomes) -> Counter:
    tally = Counter(o["outcome"].split(":")[0] for o in outcomes)
    bad = [(case, o) for case, o in zip(cases, outcomes) if o["outcome"].split(":")[0] in ("OTHER", "CRASH", "HANG")]
    assert not bad, f"{len(bad)} of {len(cases)} damaged files gave no named DataError: {bad[:5]}"
    for case, o in zip(cases, outcomes):
        if o["outcome"].startswith("DataError"):
            assert case["file"] in o["message"], o  # every error names the file
    return tally


def test_damaged_sample_files_read_fine_or_raise_a_named_data_error(tmp_path):
    cases = fuzz_cases(per_file=6)
    tally = check(cases, run_fuzz(cases, tmp_path, timeout_s=240))
    assert tally["DataError"] > 0  # the campaign does reach the readers' error paths


@pytest.mark.slow
def test_fuzz_campaign_many_damaged_files(tmp_path):
    cases = fuzz_cases(per_file=60, seed=1)
    tally = check(cases, run_fuzz(cases, tmp_path, timeout_s=600))
    print(f"fuzz: {len(cases)} cases: {dict(tally)}")
