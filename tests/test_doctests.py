"""The docstring examples of the public entry points run and print what they show.

Listed modules only (not ``--doctest-modules`` over the package): some docstrings show a full training
run, which is not a test. A module added here must hold at least one example.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = (
    "hpcdl",  # hpcdl.compressed / hpcdl.Policy
    "hpcdl.compress.registry",  # get_codec
    "hpcdl.runtime.policy",  # method spec parsing: config_from_spec, policy_from_spec, spec_from_config
    "hpcdl.units",  # parse_bytes
    "hpcdl.errors",
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, one_thread):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=False, verbose=False)
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (run with -s)"
