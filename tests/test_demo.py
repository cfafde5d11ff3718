"""``hpcdl demo`` end to end on the climate sample, cut to one step per run and a tiny budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.demo import format_table, run_demo
from hpcdl.train.comparison import DEFAULT_METHOD_LABEL


@pytest.mark.slow
def test_demo_trains_baseline_and_the_default_policy_and_reports_the_batch_that_fits(tmp_path):
    # At 12 MiB the baseline fits about 6 samples and sz about 10: a gap far past the CPU peak's noise (about
    # 0.5 MiB of resident pages per probe). At 4 MiB both fit 2 and one noisy probe flipped the comparison.
    rows, missing = run_demo(tmp_path, epochs=1, steps_per_epoch=1, budget="12MiB", workloads=("climate-deeplab",),
                             progress=False)
    assert missing == {}
    baseline, compressed = rows
    assert (baseline.method, compressed.method) == ("baseline", DEFAULT_METHOD_LABEL)
    assert baseline.activation_packed_bytes == 0 and compressed.activation_original_bytes > \
        3 * compressed.activation_packed_bytes
    assert compressed.max_batch > baseline.max_batch >= 1
    assert baseline.metric_name == "miou" and 0 <= compressed.val_metric <= 1
    table = format_table(rows, {"hep-jets": "sample missing"})
    assert "deeplabv3p-climate (tiny)" in table and DEFAULT_METHOD_LABEL in table and "NOT RUN: hep-jets" in table
    for row in rows:
        assert (Path(row.run_dir) / "summary.json").exists() and row.run_dir in table


def test_the_demo_command_ends_with_its_time_in_the_form_ci_checks(monkeypatch, capsys, tmp_path):
    """`hpcdl demo` prints `demo time: N s` last; tools/check_newcomer.py fails CI when N > 180."""
    import importlib.util

    import hpcdl.demo
    from hpcdl.cli import main

    monkeypatch.setattr(hpcdl.demo, "run_demo", lambda *args, **kwargs: ([], {}))
    assert main(["demo", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    spec = importlib.util.spec_from_file_location("check_newcomer", Path(__file__).parents[1] / "tools" /
                                                  "check_newcomer.py")
    check_newcomer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_newcomer)
    assert printed.splitlines()[-1].startswith("demo time: ")
    assert check_newcomer.demo_seconds(printed) is not None and check_newcomer.check_time(printed) == []
