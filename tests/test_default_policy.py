"""The default policy (issue 13): gradient cosine >= 0.99 on the issue's reproductions and on a zoo model; the
gradient comparison it is measured with; ``hpcdl bench gradients``."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hpcdl.bench.gradients import (
    COSINE_FLOOR,
    REPRODUCTIONS,
    GradientBenchError,
    format_report,
    measure_policies,
    parse_policies,
    run_gradient_benchmark,
    write_report,
)
from hpcdl.cli import main
from hpcdl.runtime import Policy
from hpcdl.runtime.fidelity import gradient_cosine, module_cosines, step_gradients
from hpcdl.runtime.policy import DEFAULT_POLICY_SPEC, policy_from_spec


@pytest.mark.parametrize("case", list(REPRODUCTIONS))
def test_the_default_policy_keeps_the_gradient_on_the_issues_reproductions(case):
    model, x, loss_fn = REPRODUCTIONS[case]()
    _, (default, old) = measure_policies(model, x, loss_fn, [DEFAULT_POLICY_SPEC, "sz:rel=1e-2"])
    assert default.error is None and default.cosine >= COSINE_FLOOR, default
    assert default.ratio > 1  # it compressed
    assert old.cosine < COSINE_FLOOR  # the reproduction still tells a good default from the old one


def test_the_default_policy_keeps_the_gradient_of_a_zoo_model():
    result = run_gradient_benchmark(["vit"], "tiny", 2, [DEFAULT_POLICY_SPEC])["results"][0]
    (default,) = result["policies"]
    assert default["error"] is None and default["cosine"] >= COSINE_FLOOR and default["ratio"] > 1, default
    assert default["worst_module_cosine"] >= 0.95, default


def test_policy_default_is_the_default_spec():
    assert Policy.default().describe() == policy_from_spec(DEFAULT_POLICY_SPEC).describe()


class _Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.body(x)


def test_exact_steps_repeat_with_the_same_dropout_and_a_lossy_step_is_compared_per_module():
    torch.manual_seed(0)
    model, x = _Dropout(), torch.randn(64, 16)
    loss_fn = lambda out: out.square().mean()  # noqa: E731
    first, second = (step_gradients(model, x, loss_fn).gradients for _ in range(2))
    assert gradient_cosine(first, second) == pytest.approx(1.0, abs=1e-12)
    assert all(torch.equal(first[name], second[name]) for name in first)  # same masks, same gradients
    lossy = step_gradients(model, x, loss_fn, "sz:rel=1e-1")
    assert lossy.stats is not None and lossy.stats.ratio > 1 and not lossy.probed
    per_module = module_cosines(lossy.gradients, first)
    assert set(per_module) == {"body.0", "body.3"}
    assert all(-1 <= cosine < 1 for cosine in per_module.values())
    flipped = {name: -grad for name, grad in first.items()}
    assert gradient_cosine(flipped, first) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="different parameters"):
        gradient_cosine({"body.0.weight": first["body.0.weight"]}, first)


def test_an_adaptive_policy_is_measured_on_a_compressed_step_after_its_probe():
    model, x, loss_fn = REPRODUCTIONS["attention"]()
    _, (adaptive,) = measure_policies(model, x, loss_fn, ["adaptive"])
    assert adaptive.probe_steps == 1 and adaptive.ratio > 1 and adaptive.cosine >= COSINE_FLOOR


def test_the_benchmark_command_writes_its_table_and_json(tmp_path, capsys):
    assert main(["bench", "gradients", "--models", "resnet18-cifar", "--scale", "tiny", "--policies",
                 "default,sz:rel=1e-1", "--cases", "none", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench-gradients.json").read_text())
    assert report["policies"] == [DEFAULT_POLICY_SPEC, "sz:rel=1e-1"] and len(report["results"]) == 1
    assert [s["policy"] for s in report["summary"]] == report["policies"]
    printed = capsys.readouterr().out
    assert "resnet18-cifar" in printed and format_report(report) in printed
    assert (tmp_path / "bench-gradients.txt").read_text() == format_report(report) + "\n"
    assert write_report(report, tmp_path)[0].name == "bench-gradients.json"


def test_bad_benchmark_input_is_refused():
    with pytest.raises(GradientBenchError, match="compresses nothing"):
        parse_policies("none")
    assert parse_policies("adaptive:alpha=1e-2,reruns=1;default") == ["adaptive:alpha=1e-2,reruns=1",
                                                                      DEFAULT_POLICY_SPEC]
    with pytest.raises(GradientBenchError, match="unknown case"):
        run_gradient_benchmark([], "tiny", 2, ["sz:rel=1e-2"], cases=["nope"])
    with pytest.raises(GradientBenchError, match="positive"):
        run_gradient_benchmark([], "tiny", 0, ["sz:rel=1e-2"])
