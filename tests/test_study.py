"""The study end to end through the real trainer, at the smallest scale on random data (seconds per run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl.cli import main
from hpcdl.study import plan_sweep, read_results, run_sweep, write_report

# Tiny runs: the jet-image CNN on random data, one epoch of two steps, one validation batch.
FAST = ["data.dataset=synthetic", "data.synthetic_samples=16", "train.val_steps=1"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _plan(methods, seeds=(0,), **kw):
    return plan_sweep(["hep-cnn"], methods, list(seeds), epochs=kw.pop("epochs", 1), batch=4, steps_per_epoch=2,
                      extra=FAST, **kw)


def _run_lines(out: Path) -> list[dict]:
    return [record for record in read_results(out).records if record["kind"] == "run"]


def test_two_run_sweep_writes_valid_results_resumes_and_reports(tmp_path):
    runs = _plan("baseline,quant:bits=2")
    summary = run_sweep(runs, tmp_path, progress=False)
    assert len(summary.ran) == 2 and not summary.failed
    lines = _run_lines(tmp_path)
    assert [line["method"] for line in lines] == ["baseline", "quant:bits=2"]
    for line in lines:
        assert line["status"] == "ok" and line["key"] in {run.key for run in runs}
        assert line["config"]["model"]["name"] == "hep-cnn" and line["seed"] == 0
        assert line["torch"] and line["hpcdl"] and line["device"]["type"] in ("cpu", "cuda")
        assert len(line["epochs"]) == 1 and line["epochs"][0]["train_loss"] > 0
        assert line["median_step_time_s"] > 0 and line["wall_time_s"] > 0 and line["peak_memory_bytes"] > 0
    quant = lines[1]
    assert quant["config"]["compression"]["method"] == "codec" and quant["config"]["compression"]["codec"]["bits"] == 2
    assert quant["activation_ratio"] > 2 and quant["activation_packed_bytes"] < quant["activation_original_bytes"]
    assert sum(m["original"] for m in quant["per_module"].values()) > 0
    stats = read_results(tmp_path).activation_stats()[("hep-cnn", lines[0]["scale"])]
    assert stats and all(0 <= s["zero_fraction"] <= 1 for s in stats.values())
    peaks = read_results(tmp_path).step_peaks()[("hep-cnn", lines[0]["scale"])]
    assert set(peaks) == {("baseline", 0), ("quant:bits=2", 0)} and all(p["peak_bytes"] > 0 for p in peaks.values())
    quant_step = peaks[("quant:bits=2", 0)]
    assert 0 < quant_step["activation_packed_bytes"] < quant_step["activation_original_bytes"]

    before = (tmp_path / "results.jsonl").read_text()
    again = run_sweep(runs, tmp_path, progress=False)
    assert again.ran == [] and sorted(again.already_done) == sorted(run.key for run in runs)
    assert (tmp_path / "results.jsonl").read_text() == before

    report = write_report(tmp_path)
    text = report.read_text()
    assert "## hep-cnn" in text and "| quant:bits=2 |" in text and "random labels" in text
    images = [part.split(")")[0] for part in text.split("](")[1:]]
    assert {Path(name).stem.rsplit("-", 1)[1] for name in images} == {"pareto", "curves", "modules", "activations"}
    for name in images:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_every_method_of_a_seed_starts_from_the_same_weights_and_data(tmp_path):
    # A lossless codec changes nothing backward sees, so its run must equal the baseline's bit for bit;
    # a different seed must differ. Together: the seed alone fixes the weights and the data order.
    run_sweep(_plan("baseline,raw", seeds=(0, 1), epochs=2), tmp_path, progress=False)
    lines = {(line["method"], line["seed"]): line for line in _run_lines(tmp_path)}
    for seed in (0, 1):
        baseline, raw = lines[("baseline", seed)], lines[("raw", seed)]
        assert baseline["first_step_loss"] == raw["first_step_loss"] is not None
        assert [e["train_loss"] for e in baseline["epochs"]] == [e["train_loss"] for e in raw["epochs"]]
    assert lines[("baseline", 0)]["first_step_loss"] != lines[("baseline", 1)]["first_step_loss"]


def test_offload_without_a_gpu_is_recorded_as_skipped_with_the_reason(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU, so offload runs")
    summary = run_sweep(_plan("offload"), tmp_path, progress=False)
    (line,) = _run_lines(tmp_path)
    assert summary.skipped == [line["key"]] and line["status"] == "skipped" and "GPU" in line["reason"]


def test_cli_runs_a_shard_and_reports(tmp_path, capsys):
    args = ["study", "run", "--models", "hep-cnn", "--methods", "baseline,cast:bf16", "--seeds", "0", "--epochs", "1",
            "--steps-per-epoch", "1", "--batch", "4", "--out", str(tmp_path), "--shard", "1/2", "--no-progress"]
    for override in FAST:
        args += ["--set", override]
    assert main(args) == 0
    assert [line["method"] for line in _run_lines(tmp_path)] == ["cast:bf16"]
    assert (tmp_path / "results-shard1of2.jsonl").exists() and not (tmp_path / "results.jsonl").exists()
    assert "1 of 2 runs; ran 1" in capsys.readouterr().out
    assert main(["study", "report", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").exists()
    assert main(["study", "run", "--models", "hep-cnn", "--methods", "sz:rel", "--out", str(tmp_path)]) == 2
    assert "bad method 'sz:rel'" in capsys.readouterr().err


def test_a_killed_sweep_leaves_a_readable_results_file(tmp_path):
    # offload (skipped at once on a CPU; quick on a GPU) finishes first, then a long baseline starts and is
    # killed without warning once it has logged a training step.
    command = [sys.executable, "-m", "hpcdl", "study", "run", "--models", "hep-cnn", "--methods", "offload,baseline",
               "--seeds", "0", "--epochs", "1", "--steps-per-epoch", "1000", "--batch", "4", "--out", str(tmp_path),
               "--no-progress", "--set", "data.dataset=synthetic", "--set", "data.synthetic_samples=5000"]
    log = tmp_path / "sweep.log"
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if any(metrics.stat().st_size > 0 for metrics in tmp_path.glob("runs/*/metrics.jsonl")):
            break
        time.sleep(0.1)
    assert process.poll() is None, f"the sweep ended before it could be killed: {log.read_text()}"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    parsed = read_results(tmp_path)
    assert parsed.truncated == {}
    assert [(run["method"], run["status"]) for run in parsed.runs()] in ([("offload", "skipped")], [("offload", "ok")])
    assert [record["kind"] for record in parsed.records] == ["run", "activation_stats"]
    plan = plan_sweep(["hep-cnn"], "offload,baseline", [0], epochs=1, batch=4, steps_per_epoch=1000,
                      extra=["data.dataset=synthetic", "data.synthetic_samples=5000"])
    assert parsed.finished_keys() == {plan[0].key}  # the killed baseline will run again on resume
