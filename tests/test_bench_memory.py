"""``hpcdl bench memory`` and the peak accounting behind it: the breakdown's parts, the rule that compression
never raises the step peak, and the command end to end with its bad-input errors."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from hpcdl import memory
from hpcdl.bench.memory import MemoryBenchError, _per_sample, parse_batches, parse_budgets, project, search_start
from hpcdl.cli import main
from hpcdl.memory.peak import MAX_LEARNING_STEPS

from runtime_models import wide_cnn, wide_cnn_batch

SMALL_CNN = memory.Workload(
    "runtime_models:wide_cnn",
    options={"channels": 8, "depth": 6},
    batch=functools.partial(wide_cnn_batch, size=32),
)

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_the_breakdown_accounts_for_the_measured_step():
    batch = 8
    model = wide_cnn(channels=8, depth=6)
    x, y = wide_cnn_batch(batch, torch.Generator().manual_seed(0), size=32)
    weights = _bytes(model.parameters())
    with memory.MeasuringProcess() as process:
        report = memory.peak(memory.TrainStep(SMALL_CNN, batch, "sz:rel=1e-2", threshold=0), process=process)
        baseline = memory.peak(memory.TrainStep(SMALL_CNN, batch, None), process=process)
    parts = memory.breakdown(report)
    # Exact sizes: every parameter has a gradient and one SGD momentum buffer of its own size.
    assert parts["weights"] == weights and parts["gradients"] == weights and parts["optimizer_state"] == weights
    assert parts["buffers"] == _bytes(model.buffers()) and parts["batch"] == _bytes((x, y))
    assert parts["resident"] == weights + parts["buffers"] + weights + parts["batch"]
    # With no size threshold every saved tensor is an entry of the session: what it holds is what it packed.
    assert parts["packed_activations"] == report.info["activation_packed_bytes"] > 0
    assert parts["saved_activations"] == parts["packed_activations"]
    assert parts["largest_packed_original"] == batch * 8 * 32 * 32 * 4  # one float feature map of the batch
    assert 0 < parts["decoded_peak"] <= report.info["activation_original_bytes"]
    # The parts sum to the peak, the remainder being the difference; the footprint adds the resident state.
    assert parts["peak"] == report.peak_bytes
    assert parts["gradients"] + parts["saved_activations"] + parts["decoded_peak"] + parts["remainder"] == parts["peak"]
    assert parts["footprint"] == parts["resident"] + parts["peak"]
    # Without a session, what the forward left held is what autograd saved (measured), and nothing is decoded.
    plain = memory.breakdown(baseline)
    assert plain["packed_activations"] is None and plain["decoded_peak"] is None
    assert plain["saved_activations"] == plain["held_after_forward"] > 0
    assert plain["gradients"] + plain["saved_activations"] + plain["remainder"] == plain["peak"]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["sz:rel=1e-2", "adaptive"])
@pytest.mark.parametrize("batch", [4, 16])
def test_compression_never_raises_the_step_peak_above_the_baseline(batch, policy):
    """The runtime's rule: at any batch, compressing never costs more peak memory than not compressing; the
    adaptive policy's usual step (after its first probe, with batch norms' inputs through the channels stage) too.

    Not its probe steps: on a model this small a probe replays up to 16 samples uncompressed (the 64 MiB floor,
    probe.REPLAY_BYTES_FLOOR), here the whole batch, so they peak above the baseline's step (docs/adaptive.md,
    "What it does not do"). Each probe runs in its own fresh process, so neither inherits heap pages from the
    other; no slack.
    """
    fresh = memory.FreshProcesses()
    baseline = memory.peak(memory.TrainStep(SMALL_CNN, batch, None), process=fresh)
    compressed = memory.peak(memory.TrainStep(SMALL_CNN, batch, policy), process=fresh)
    assert compressed.peak_bytes <= baseline.peak_bytes, (batch, compressed.peak_bytes, baseline.peak_bytes)


@pytest.mark.slow
def test_a_probe_step_whose_exact_replay_does_not_fit_needs_about_a_compressed_steps_memory():
    """At a batch of 2 whose uncompressed saved tensors are large (67 MiB a sample here, as at DeepCAM's full
    input), an exact replay of the fewest rows a probe replays (2) would hold an uncompressed step's tensors,
    so a probe step would peak as high as the baseline's step (160 MiB here, against 86 MiB for a compressed
    step); the reference replay compressed as the step keeps every probe step (every step probes here) within
    1.25x of a compressed step that does not probe."""
    large = memory.Workload("runtime_models:wide_cnn", options={"channels": 8, "depth": 4},
                            batch=functools.partial(wide_cnn_batch, size=512))
    fresh = memory.FreshProcesses()
    baseline = memory.peak(memory.TrainStep(large, 2, None), process=fresh)
    compressed = memory.peak(memory.TrainStep(large, 2, "adaptive:probe_every=1000"), process=fresh)
    probing = memory.peak(memory.TrainStep(large, 2, "adaptive:probe_every=1"), process=fresh)
    assert compressed.info["learning_steps"] == 1 and probing.info["learning_steps"] == MAX_LEARNING_STEPS
    assert compressed.peak_bytes < 0.75 * baseline.peak_bytes
    assert compressed.worst_bytes < baseline.peak_bytes  # the first probe, at the default codec, measured too
    assert probing.worst_bytes <= 1.25 * compressed.peak_bytes, (probing.worst_bytes, compressed.peak_bytes)


def test_a_measuring_process_sends_each_steps_time_while_it_measures():
    lines: list[str] = []
    with memory.MeasuringProcess(threads=1, progress=lines.append) as process:
        report = memory.peak(memory.TrainStep(SMALL_CNN, 2, None, warmup_steps=3), process=process)
    assert report.peak_bytes > 0
    assert [line.partition(": ")[0] for line in lines] == [
        "warm-up step 1 of 3", "warm-up step 2 of 3", "warm-up step 3 of 3", "measured step"]
    assert all(line.endswith(" s") for line in lines)  # "...: 0.1 s": none of these steps learned


def test_step_progress_marks_learning_steps_and_stops_at_its_end():
    lines: list[str] = []
    step = memory.TrainStep(SMALL_CNN, 2, "adaptive", threshold=0)()
    with memory.step_progress(lines.append):
        step()  # an adaptive policy's first step probes its saved tensors' sensitivities
    step()
    line, rehearsal = lines  # a first step that learned is rehearsed: the step measured next is the first again
    assert line.startswith("warm-up step 1 of 1: ") and line.endswith("(a learning step: the method observed gradients)")
    assert rehearsal.startswith("the method's first step learned: it was a rehearsal")


def test_the_per_sample_peak_is_the_slope_between_the_two_largest_batches():
    """Scratch that grows only up to the thread count (one buffer per thread with a sample) must not count
    as a per-sample cost: batch 1 -> 2 adds 300 here, 2 -> 4 adds 100 a sample."""
    peaks = [{"batch": 1, "peak_bytes": 1000}, {"batch": 2, "peak_bytes": 1300}, {"batch": 4, "peak_bytes": 1500}]
    assert _per_sample(peaks, lambda row: row["peak_bytes"]) == (100, 1100)
    assert _per_sample(peaks[:1], lambda row: row["peak_bytes"]) is None


def test_the_projection_is_linear_in_the_batch():
    rows = project(per_sample=2**30, fixed=2**30)  # 1 GiB a sample on top of 1 GiB
    assert [(row["gpu"], row["projected_batch"]) for row in rows] == [
        ("A100 40GB", 39), ("A100 80GB", 79), ("H200 141GB", 139)]
    assert all(row["projected_batch"] is None for row in project(per_sample=0, fixed=2**20))
    assert all(row["projected_batch"] == 0 for row in project(per_sample=2**30, fixed=2**40))


def test_the_projection_fits_the_learning_steps_too_where_they_need_more():
    step, probes = (2**30, 2**30), (2**30, 8 * 2**30)  # probes: 7 GiB more at every batch
    rows = project(*step, learning=probes)
    assert [(row["projected_batch"], row["limited_by"]) for row in rows] == [
        (32, "learning steps"), (72, "learning steps"), (132, "learning steps")]
    assert [row["projected_batch"] for row in project(*step, learning=(2**29, 2**30))] == [39, 79, 139]
    assert {row["limited_by"] for row in project(*step, learning=(2**29, 2**30))} == {"step"}


def test_a_budget_search_starts_where_the_fit_of_the_measured_peaks_meets_the_budget():
    fit = (100.0, 1100.0)  # 100 bytes a sample on top of 1100
    assert search_start(fit, 3000, limit=1000) == 19  # 1100 + 19 * 100 = 3000
    assert search_start(fit, 3099, limit=1000) == 19 and search_start(fit, 3100, limit=1000) == 20
    assert search_start(fit, 3000, limit=8) == 8
    assert search_start(fit, 500, limit=8) == 1  # the fit says not even one sample: the search starts at 1
    assert search_start(None, 3000, limit=8) == 1 and search_start((0.0, 10.0), 3000, limit=8) == 1


def test_batch_and_budget_lists_are_parsed_or_refused():
    assert parse_batches("4, 1,2,2") == (1, 2, 4)
    assert parse_budgets("1MiB,2KiB") == (("1MiB", 2**20), ("2KiB", 2048))
    assert parse_budgets("") == ()
    for text in ("", " , ", "1,two", "0,1"):
        with pytest.raises(MemoryBenchError):
            parse_batches(text)
    with pytest.raises(MemoryBenchError, match="'lots'"):
        parse_budgets("1MiB,lots")


@pytest.mark.slow
def test_the_command_measures_writes_json_and_a_plot(tmp_path, capsys):
    out = tmp_path / "bench"
    # the climate model: 2 MiB of activations a sample, so that batch 2's peak stands clear of batch 1's under
    # the noise of a loaded machine's RSS (hep-cnn's 0.16 MiB once measured no per-sample cost in a full run)
    code = main(["bench", "memory", "--model", "deeplabv3p-climate", "--scale", "tiny", "--methods", "baseline,sz:rel=1e-2",
                 "--batches", "1,2", "--budgets", "64MiB", "--limit", "2", "--threads", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    report = json.loads((out / "bench-memory.json").read_text())
    assert (out / "bench-memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["model"] == "deeplabv3p-climate" and report["scale"] == "tiny" and report["batches"] == [1, 2]
    assert report["budgets"] == [{"budget": "64MiB", "budget_bytes": 64 * 2**20}]
    assert [m["method"] for m in report["methods"]] == ["baseline", "sz:rel=1e-2"]
    assert [m["runtime"] for m in report["methods"]] == ["none", "codec:sz:rel=0.01"]
    baseline, compressed = report["methods"]
    for method in report["methods"]:
        assert [p["batch"] for p in method["peaks"]] == [1, 2]
        first, second = method["peaks"]
        assert method["per_sample_bytes"] == second["peak_bytes"] - first["peak_bytes"]
        assert method["fixed_bytes"] == first["peak_bytes"] - method["per_sample_bytes"]
        assert [row["gpu"] for row in method["projection"]] == ["A100 40GB", "A100 80GB", "H200 141GB"]
        for peak in method["peaks"]:
            parts = peak["breakdown"]
            assert parts["peak"] == peak["peak_bytes"]
            assert parts["gradients"] + parts["saved_activations"] + (parts["decoded_peak"] or 0) \
                + parts["remainder"] == parts["peak"]
        (search,) = method["searches"]
        assert search["budget_bytes"] == 64 * 2**20 and search["batch"] == 2 and search["hit_limit"]
        fit = (method["per_sample_bytes"], method["fixed_bytes"])
        assert search["start"] == search_start(fit, 64 * 2**20, 2)  # 2 where the peak grows with the batch
        assert [batch for batch, _ in search["probes"]] == list(range(search["start"], 3))
    assert baseline["per_sample_ratio_to_baseline"] == 1.0 and report["complete"] is True
    assert compressed["peaks"][-1]["activation_packed_bytes"] < compressed["peaks"][-1]["activation_original_bytes"]
    assert "Step peak" in captured.out and "PROJECTED largest per-GPU batch" in captured.out
    assert "sz:rel=1e-2" in captured.out and "MLPerf HPC" in captured.out
    assert "[1] baseline: batch 1 peak" in captured.err and "s elapsed" in captured.err
    assert "\n    warm-up step 1 of 1: " in captured.err and "\n    measured step: " in captured.err


def test_a_stopped_run_keeps_every_probe_it_measured(tmp_path, monkeypatch):
    """The JSON is written after every probe (marked incomplete), so hours of probes survive a run that dies."""
    real_peak, batches_asked = memory.peak, []

    def dies_at_the_third_probe(setup, **kw):
        batches_asked.append(setup.batch_size)
        if len(batches_asked) == 3:
            raise memory.MeasuringProcessError("the measuring process was killed by SIGKILL")  # as by the OOM killer
        return real_peak(setup, **kw)

    monkeypatch.setattr(memory, "peak", dies_at_the_third_probe)
    assert main(["bench", "memory", "--model", "hep-cnn", "--scale", "tiny", "--methods", "baseline,sz:rel=1e-2",
                 "--batches", "1,2", "--threads", "1", "--out", str(tmp_path)]) == 1  # a one-line error, no traceback
    report = json.loads((tmp_path / "bench-memory.json").read_text())
    assert report["complete"] is False and not (tmp_path / "bench-memory.png").exists()
    (baseline,) = report["methods"]  # as written after the baseline's second probe: sz's first never ended
    assert [peak["batch"] for peak in baseline["peaks"]] == [1, 2]
    first, second = (peak["peak_bytes"] for peak in baseline["peaks"])
    assert baseline["per_sample_bytes"] == second - first and baseline["projection"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bench-memory.json"]  # no staged file left


DRAWN: list[float] = []  # the first input value of every batch recording_batch drew


def recording_batch(batch_size: int, generator: torch.Generator):
    x, y = wide_cnn_batch(batch_size, generator, size=16)
    DRAWN.append(float(x.flatten()[0]))
    return x, y


def test_warm_up_steps_run_before_the_measured_step_each_on_a_batch_of_its_own():
    """An adaptive policy learns from its warm-up steps (its noise estimate compares gradients of different
    batches), so each warm-up step but the last, which measure_step runs on the measured batch, draws its own."""
    DRAWN.clear()
    work = memory.Workload("runtime_models:wide_cnn", options={"channels": 4, "depth": 2}, batch=recording_batch)
    model_after = {}

    def optimizer(parameters):
        params = list(parameters)
        model_after["params"] = params
        return torch.optim.SGD(params, lr=0.1)

    step = memory.TrainStep(work, 4, "sz:rel=1e-2", warmup_steps=3, optimizer=optimizer)()
    assert len(DRAWN) == 3 and len(set(DRAWN)) == 3  # the measured batch, then one for each of 2 warm-up steps
    fresh, *_ = work.build(4, 0)
    assert any(not torch.equal(p, q) for p, q in zip(model_after["params"], fresh.parameters()))  # they trained
    assert step()["activation_packed_bytes"] > 0
    with pytest.raises(ValueError, match="warmup_steps must be a positive int"):
        memory.TrainStep(work, 4, warmup_steps=0)


@pytest.mark.parametrize("args, message", [
    (["--methods", "baseline,nosuchcodec:rel=1"], "bad method 'nosuchcodec:rel=1'"),
    (["--budgets", "lots"], "--budgets holds memory sizes"),
    (["--batches", ""], "--batches is a comma-separated list"),
    (["--batches", "1", "--input-shape", "1x32"], "input_shape for hep-cnn"),
    (["--batches", "1", "--input-shape", "1x128x128"], "cannot run on its batch of shape (1, 1, 128, 128)"),
    (["--methods", "offload"], "needs --device cuda"),
    (["--warmup-steps", "0"], "--warmup-steps is a whole number of steps >= 1"),
])
def test_the_command_refuses_bad_input(args, message, capsys, tmp_path):
    code = main(["bench", "memory", "--model", "hep-cnn", "--scale", "tiny", "--out", str(tmp_path), *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bench-memory.json").exists()


def test_recompute_with_a_codec_is_one_method_spec_for_the_study_and_the_benchmark():
    from hpcdl.train.config import load_config
    from hpcdl.train.method_spec import parse_method

    method = parse_method("recompute+sz:rel=1e-2")
    assert method.kind == "recompute+codec" and method.codec_config == {"id": "sz", "mode": "rel", "bound": 0.01}
    assert parse_method("checkpoint+sz:rel=1e-2") == method  # the old name of recompute
    assert method.activation_method().describe() == "recompute+codec:sz:rel=0.01"
    config = load_config("hep-jets", overrides=method.overrides())
    assert config["compression"]["method"] == "recompute+codec"
    assert config["compression"]["codec"] == {"id": "sz", "mode": "rel", "bound": 0.01}
    assert parse_method("recompute+offload").activation_method().describe() == "recompute+offload"
