"""The study's parts on their own: method specs, shards, the results file, activation statistics, summaries."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from hpcdl.study.activations import capture_activation_stats
from hpcdl.study.results import append_record, read_results
from hpcdl.study.summary import summarise_model
from hpcdl.study.sweep import PlannedRun, parse_shard, plan_sweep, shard
from hpcdl.train.config import load_config
from hpcdl.train.method_spec import parse_method, parse_methods


@pytest.mark.parametrize("spec, expected", [
    ("sz:rel=1e-2", {"id": "sz", "mode": "rel", "bound": 0.01}),
    ("sz:abs=1e-5", {"id": "sz", "mode": "abs", "bound": 1e-5}),
    ("quant:bits=2", {"id": "quant", "bits": 2}),
    ("quant:bits=4,group_size=128", {"id": "quant", "bits": 4, "group_size": 128}),
    ("quant:bits=2,seed=7", {"id": "quant", "bits": 2, "seed": 7}),  # any option of the codec, not a fixed list
    ("cast:bf16", {"id": "cast", "dtype": "bf16"}),
    ("raw", {"id": "raw"}),
])
def test_codec_methods_become_the_trainers_codec_config(spec, expected):
    # Start from a shipped config, whose codec (the default policy's) must not leak into the method's.
    config = load_config("hep-jets", overrides=parse_method(spec).overrides())
    assert config["compression"]["method"] == "codec"
    assert config["compression"]["codec"] == expected


@pytest.mark.parametrize("spec, method", [("baseline", "none"), ("none", "none"), ("recompute", "recompute"),
                                          ("offload", "offload")])
def test_plain_methods_select_the_trainers_method(spec, method):
    parsed = parse_method(spec)
    assert load_config("hep-jets", overrides=parsed.overrides())["compression"]["method"] == method
    assert parsed.needs_gpu == (spec == "offload")


def test_method_lists_split_on_commas_but_keep_codec_options_together():
    methods = parse_methods("baseline, quant:bits=4,group_size=128 ,cast:bf16,recompute")
    assert [m.spec for m in methods] == ["baseline", "quant:bits=4,group_size=128", "cast:bf16", "recompute"]
    assert methods[1].codec_config == {"id": "quant", "bits": 4, "group_size": 128}


@pytest.mark.parametrize("specs, message", [
    ("baseline,none", "same method"),
    ("nosuchcodec:rel=1", "bad method 'nosuchcodec:rel=1'"),
    ("quant:bits", "bad method"),
    ("", "non-empty"),
])
def test_bad_method_lists_are_refused_with_the_reason(specs, message):
    with pytest.raises(ValueError, match=message):
        parse_methods(specs)


def _runs(count: int) -> list[PlannedRun]:
    method = parse_method("baseline")
    return [PlannedRun("hep-cnn", "tiny", method, seed, 1, 8, "hep-jets") for seed in range(count)]


@pytest.mark.parametrize("total, shards", [(1, 1), (7, 3), (9, 3), (2, 5), (18, 4)])
def test_shards_are_disjoint_and_complete(total, shards):
    runs = _runs(total)
    parts = [shard(runs, index, shards) for index in range(shards)]
    keys = [run.key for part in parts for run in part]
    assert sorted(keys) == sorted(run.key for run in runs)
    assert len(set(keys)) == len(keys) == total
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("text", ["3/3", "-1/2", "1/0", "a/b", "1", "1/2/3"])
def test_bad_shards_are_refused(text):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)


def test_run_keys_depend_on_everything_that_defines_a_run_and_nothing_else():
    base = PlannedRun("hep-cnn", "tiny", parse_method("sz:rel=1e-2"), 0, 2, 8, "hep-jets")
    same = PlannedRun("hep-cnn", "tiny", parse_method("sz:rel=0.01"), 0, 2, 8, "hep-jets")
    assert base.key == same.key
    others = [
        PlannedRun("hep-cnn", "tiny", parse_method("sz:rel=1e-3"), 0, 2, 8, "hep-jets"),
        PlannedRun("hep-cnn", "tiny", parse_method("sz:rel=1e-2"), 1, 2, 8, "hep-jets"),
        PlannedRun("hep-cnn", "small", parse_method("sz:rel=1e-2"), 0, 2, 8, "hep-jets"),
        PlannedRun("hep-cnn", "tiny", parse_method("sz:rel=1e-2"), 0, 3, 8, "hep-jets"),
        PlannedRun("hep-cnn", "tiny", parse_method("sz:rel=1e-2"), 0, 2, 8, "hep-jets", extra=("optimizer.lr=0.1",)),
    ]
    assert len({base.key, *(run.key for run in others)}) == 1 + len(others)


def test_results_file_round_trips_and_nonfinite_numbers_become_null(tmp_path):
    append_record(tmp_path, {"kind": "run", "key": "a", "status": "ok", "loss": float("nan")})
    append_record(tmp_path, {"kind": "run", "key": "b", "status": "failed"})
    parsed = read_results(tmp_path)
    assert [r["key"] for r in parsed.records] == ["a", "b"]
    assert parsed.records[0]["loss"] is None
    for line in (tmp_path / "results.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    assert parsed.finished_keys() == {"a", "b"}
    assert parsed.finished_keys(retry_failed=True) == {"a"}


def test_a_truncated_last_line_is_reported_and_the_next_record_starts_fresh(tmp_path):
    append_record(tmp_path, {"kind": "run", "key": "a", "status": "ok"})
    with (tmp_path / "results.jsonl").open("a") as handle:
        handle.write('{"kind": "run", "key": "b", "sta')  # a writer killed mid-line
    parsed = read_results(tmp_path)
    assert [r["key"] for r in parsed.records] == ["a"]
    assert list(parsed.truncated.values())[0].startswith('{"kind": "run", "key": "b"')
    append_record(tmp_path, {"kind": "run", "key": "c", "status": "ok"})
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["key"] == "a" and json.loads(lines[2])["key"] == "c"
    # The unfinished line is now in the middle: reading must say so, not skip it silently.
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_results(tmp_path)


def test_missing_results_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="hpcdl study run"):
        read_results(tmp_path)


def test_activation_stats_describe_saved_tensors_per_module_without_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    stats = capture_activation_stats(model, torch.randn(512, 64))
    # Linear 0 saves its input (the batch), ReLU its output (saved once although Linear 2 saves it too).
    assert set(stats) == {"0", "1"}
    assert stats["0"]["numel"] == 512 * 64 and stats["0"]["zero_fraction"] == 0.0
    assert stats["1"]["numel"] == 512 * 256 and 0.3 < stats["1"]["zero_fraction"] < 0.7
    assert stats["1"]["min"] == 0.0 and stats["1"]["quantiles"]["0.25"] == 0.0
    normal = stats["0"]["quantiles"]
    assert abs(normal["0.5"]) < 0.05 and abs(normal["0.75"] - 0.674) < 0.05 and abs(stats["0"]["std"] - 1) < 0.05
    assert model.training


def _run(method, seed, metric, peak, kind="codec", step=1.0, status="ok", first=2.3):
    return {"model": "m", "scale": "tiny", "method": method, "method_kind": kind, "seed": seed, "status": status,
            "epochs": [{"epoch": 0, "val_metric": metric}], "peak_memory_bytes": peak, "median_step_time_s": step,
            "activation_ratio": None if kind != "codec" else 10.0, "first_step_loss": first}


def test_summary_pairs_methods_with_the_baseline_of_the_same_seed():
    runs = [_run("baseline", 0, 0.80, 100, "baseline"), _run("baseline", 1, 0.82, 100, "baseline"),
            _run("sz", 0, 0.79, 50, step=2.0), _run("sz", 1, 0.83, 25, step=3.0),
            _run("quant", 0, 0.60, 20), _run("quant", 1, 0.61, 20, first=2.4),
            _run("offload", 0, None, None, "offload", status="skipped") | {"reason": "no GPU"}]
    step_peaks = {("baseline", 0): {"peak_bytes": 90}, ("baseline", 1): {"peak_bytes": 110},
                  ("sz", 0): {"peak_bytes": 30}, ("sz", 1): {"peak_bytes": 55}}
    summary = summarise_model(runs, step_peaks)
    by_name = {m.method: m for m in summary.methods}
    assert by_name["sz"].step_peak_reduction.low == 2.0 and by_name["sz"].step_peak_reduction.high == 3.0
    assert by_name["quant"].step_peak_reduction is None
    assert [m.method for m in summary.methods] == ["baseline", "sz", "quant", "offload"]
    sz = by_name["sz"]
    assert math.isclose(sz.metric_change.mean, 0.0, abs_tol=1e-12) and math.isclose(sz.metric_change.low, -0.01)
    assert sz.peak_reduction.low == 2.0 and sz.peak_reduction.high == 4.0
    assert sz.step_time_ratio.mean == 2.5 and not sz.hurts
    assert by_name["quant"].hurts and math.isclose(by_name["quant"].metric_change.mean, -0.205)
    assert by_name["offload"].skipped == ["no GPU"] and by_name["offload"].seeds == []
    assert summary.same_start == {0: True, 1: False}


def test_shards_write_their_own_files_and_are_read_together(tmp_path):
    append_record(tmp_path, {"kind": "run", "key": "a", "status": "ok"}, shard=(0, 2))
    append_record(tmp_path, {"kind": "run", "key": "b", "status": "ok"}, shard=(1, 2))
    append_record(tmp_path, {"kind": "run", "key": "c", "status": "ok"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results-shard0of2.jsonl", "results-shard1of2.jsonl",
                                                           "results.jsonl"]
    parsed = read_results(tmp_path)
    assert [r["key"] for r in parsed.records] == ["c", "a", "b"] and parsed.finished_keys() == {"a", "b", "c"}


def test_an_edited_base_config_makes_new_run_keys(tmp_path):
    config = tmp_path / "base.yaml"
    config.write_text("model: {name: hep-cnn}\noptimizer: {lr: 1.0e-3}\n")
    first = plan_sweep(["hep-cnn"], "baseline", [0], epochs=1, base_config=str(config))
    assert plan_sweep(["hep-cnn"], "baseline", [0], epochs=1, base_config=str(config))[0].key == first[0].key
    config.write_text("model: {name: hep-cnn}\noptimizer: {lr: 2.0e-3}\n")
    assert plan_sweep(["hep-cnn"], "baseline", [0], epochs=1, base_config=str(config))[0].key != first[0].key


def test_checkpoint_is_the_old_name_of_the_recompute_method():
    assert parse_method("checkpoint") == parse_method("recompute") == parse_method(" recompute ")
    assert parse_method("checkpoint").overrides() == ["compression.method=recompute"]
    with pytest.raises(ValueError, match="'checkpoint' and 'recompute' are the same method|same method"):
        parse_methods("recompute,checkpoint")


def test_records_of_the_old_checkpoint_method_are_read_and_summarised_as_recompute(tmp_path):
    """Results written before the rename (method "checkpoint") group with new "recompute" runs of the same model;
    a seed measured under both names counts once, the later record."""
    for record in [_run("baseline", 0, 0.80, 100, "baseline") | {"key": "b0"},
                   _run("checkpoint", 0, 0.80, 60, "checkpoint") | {"key": "old0"},
                   _run("checkpoint", 1, 0.81, 60, "checkpoint") | {"key": "old1"},
                   _run("recompute", 1, 0.82, 50, "recompute") | {"key": "new1"},
                   {"kind": "step_peak", "key": "old0", "model": "m", "scale": "tiny", "method": "checkpoint",
                    "method_kind": "checkpoint", "seed": 0, "peak_bytes": 45}]:
        append_record(tmp_path, {"kind": "run", **record})
    parsed = read_results(tmp_path)
    assert {run["method"] for run in parsed.runs()} == {"baseline", "recompute"}
    assert {run["method_kind"] for run in parsed.runs()} == {"baseline", "recompute"}
    assert ("recompute", 0) in parsed.step_peaks()[("m", "tiny")]
    summary = summarise_model(parsed.runs(), parsed.step_peaks()[("m", "tiny")])
    recompute = {m.method: m for m in summary.methods}["recompute"]
    assert [m.method for m in summary.methods] == ["baseline", "recompute"]
    assert recompute.seeds == [0, 1] and recompute.kind == "recompute"
    assert recompute.val_metric.high == 0.82  # seed 1's later record, not the old one
    assert recompute.peak_reduction.low == 100 / 60  # seed 0, the only seed with a baseline


def test_run_spec_is_the_old_name_of_planned_run():
    import hpcdl.study
    from hpcdl.study import steppeak

    assert hpcdl.study.RunSpec is hpcdl.study.PlannedRun is PlannedRun and steppeak.spec_loss is steppeak.model_loss
    assert _runs(1)[0] == hpcdl.study.RunSpec("hep-cnn", "tiny", parse_method("baseline"), 0, 1, 8, "hep-jets")


def test_the_old_study_methods_module_warns_and_gives_the_method_spec_objects():
    import importlib
    import sys

    from hpcdl.train import method_spec

    sys.modules.pop("hpcdl.study.methods", None)  # the warning comes once per import of the module
    with pytest.warns(FutureWarning, match=r"hpcdl.study.methods is deprecated.*hpcdl.train.method_spec"):
        old = importlib.import_module("hpcdl.study.methods")
    assert old.__all__ and all(getattr(old, name) is getattr(method_spec, name) for name in old.__all__)
    assert old.parse_method("sz:rel=1e-2") == method_spec.parse_method("sz:rel=1e-2")
