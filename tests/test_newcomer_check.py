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


def test_a_demo_over_three_minutes_or_without_its_time_fails():
    from hpcdl.demo import elapsed_line

    within = GOOD + elapsed_line(179.6) + "\n"  # printed as 180 s: at the limit, not over it
    assert check_newcomer.demo_seconds(within) == 180 and check_newcomer.check_time(within) == []
    slow = GOOD + elapsed_line(181.0) + "\n"
    assert check_newcomer.check_table(slow) == []  # the table alone is sound
    assert check_newcomer.check_time(slow) == [
        "the demo took 181 s, over its limit of 180 s (3 minutes, the install not counted): a newcomer's first "
        "run must finish within 3 minutes on 2 cores"]
    assert any("no 'demo time: N s' line" in p for p in check_newcomer.check_time(GOOD))


def test_the_command_line_check_reads_the_time_and_exits_1_when_slow(tmp_path):
    import subprocess
    import sys

    from hpcdl.demo import elapsed_line

    for seconds, code in ((95.0, 0), (250.0, 1)):
        stdout = tmp_path / f"stdout-{seconds:.0f}"
        stdout.write_text(GOOD + elapsed_line(seconds) + "\n")
        done = subprocess.run([sys.executable, str(ROOT / "tools" / "check_newcomer.py"), "--demo-table", str(stdout)],
                              capture_output=True, text=True)
        assert done.returncode == code, done.stderr
        assert ("the demo took 250 s, over its limit of 180 s" in done.stderr) == (code == 1)
