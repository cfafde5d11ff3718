"""Lint and type checks as tests, so `bash tools/test.sh` runs them with everything else.

Their configuration (rules, ignores and why) is in pyproject.toml: [tool.ruff] and [tool.mypy].
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed; `pip install -e .[test]` installs it")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_finds_nothing():
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing():
    result = _run("mypy")  # files and options: [tool.mypy] in pyproject.toml
    assert result.returncode == 0, result.stdout + result.stderr
