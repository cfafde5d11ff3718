"""tools/check_newcomer.py: CI's check of the README's first command and of the table the demo prints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_newcomer", ROOT / "tools" / "check_newcomer.py")
check_newcomer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_newcomer)

GOOD = """\
model                      activations  val metric  saved/step  ratio  train peak  batch @ budget     samples/s
-------------------------  -----------  ----------  ----------  -----  ----------  -----------------  ---------
deeplabv3p-climate (tiny)  baseline     miou 0.387  15.8 MiB    1.0x   100.5 MiB   12 under 24.0 MiB  30
deeplabv3p-climate (tiny)  sz rel 1e-3  miou 0.383  2.0 MiB     7.9x   39.8 MiB    22 under 24.0 MiB  20
hep-cnn (small)            baseline     auc 0.942   38.8 MiB    1.0x   80.3 MiB    35 under 24.0 MiB  400
hep-cnn (small)            sz rel 1e-3  auc 0.943   3.1 MiB     12.3x  40.1 MiB    38 under 24.0 MiB  300

run directories (config.resolved.yaml, metrics.jsonl, summary.json):
"""


def test_the_readme_command_is_the_first_line_of_its_first_bash_block():
    assert check_newcomer.readme_command(str(ROOT / "README.md")) == "bash tools/setup.sh && .venv/bin/hpcdl demo"


def test_the_checked_label_is_the_default_policys():
    from hpcdl.train.comparison import DEFAULT_METHOD_LABEL

    assert check_newcomer.DEFAULT_LABEL == DEFAULT_METHOD_LABEL


def test_a_sound_demo_table_passes():
    assert check_newcomer.check_table(GOOD) == []


def test_a_missing_workload_a_weak_ratio_and_a_smaller_batch_fail():
    missing = GOOD.replace("hep-cnn (small)            sz rel 1e-3  auc 0.943   3.1 MiB     12.3x", "") \
        + "NOT RUN: hep-jets: sample missing\n"
    assert any("NOT RUN" in p for p in check_newcomer.check_table(missing))
    weak = GOOD.replace("7.9x ", "1.2x ")
    assert any("activation ratio 1.2x" in p for p in check_newcomer.check_table(weak))
    smaller = GOOD.replace("22 under", "11 under")
    assert any("less than the baseline's 12" in p for p in check_newcomer.check_table(smaller))
    assert check_newcomer.check_table("Traceback (most recent call last):\n") != []
