"""hpcdl.memory: a step's real peak (measured in a fresh process on the CPU) and the batch search over measured peaks."""

from __future__ import annotations

import functools

import pytest
import torch

from hpcdl import memory
from hpcdl.cli import main
from hpcdl.memory import search
from hpcdl.train.config import ConfigError

from runtime_models import allocating_setup, failing_setup, killed_setup, learning_then_usual_setup, wide_cnn_batch

MiB = 2**20
SMALL_CNN = memory.Workload(
    "runtime_models:wide_cnn",
    options={"channels": 8, "depth": 6},
    batch=functools.partial(wide_cnn_batch, size=32),
)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread


def test_peak_is_what_the_step_itself_allocates():
    report = memory.peak(functools.partial(allocating_setup, 48))
    assert report.method == "cpu_peak_rss" and report.device == "cpu"
    assert 47 * MiB <= report.peak_bytes < 52 * MiB  # the step's 48 MiB, not the interpreter and torch before it
    assert report.before_bytes > 50 * MiB  # torch itself was resident before the step and is not counted
    assert report.info == {"sum": 48 * 2**18}


def test_a_killed_measuring_process_is_a_run_error_that_says_how_it_ended():
    with pytest.raises(memory.MeasuringProcessError, match="killed by SIGKILL .*out-of-memory killer") as caught:
        memory.peak(killed_setup)
    assert caught.value.exit_code == 1 and isinstance(caught.value, RuntimeError)


ORPHANING_PARENT = """
import functools, time
from hpcdl.memory import MeasuringProcess
child = MeasuringProcess(1)
print(child.process.pid, flush=True)
child.peak(functools.partial(time.sleep, 600))  # a measurement far longer than the test waits
"""


def test_a_measuring_process_whose_parent_was_killed_stops_instead_of_finishing_its_measurement():
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    parent = subprocess.Popen([sys.executable, "-c", ORPHANING_PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(1)  # the child may be importing torch or already measuring: it must stop either way
    parent.kill()
    parent.wait()
    parent.stdout.close()
    status = Path(f"/proc/{child}/status")
    deadline = time.monotonic() + 30  # starting torch (if it had not) and ORPHAN_CHECK_S, on a loaded machine
    while status.exists() and "State:\tZ" not in status.read_text():
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the orphaned measuring process was still running 30 s after its parent died")
        time.sleep(0.1)


def test_a_measuring_script_reexecutes_itself_once_with_the_measuring_processes_allocator_settings(tmp_path):
    import os
    import subprocess
    import sys

    from hpcdl.memory.allocator import child_env

    script = tmp_path / "measure.py"
    script.write_text("import os, sys\nfrom hpcdl.memory.allocator import run_with_child_env\nprint('start', flush=True)\n"
                      "run_with_child_env()\nprint(os.environ['MALLOC_MMAP_THRESHOLD_'], sys.argv[1:])\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    ran = subprocess.run([sys.executable, str(script), "a", "b"], capture_output=True, text=True, env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["start", "start", f"{child_env()['MALLOC_MMAP_THRESHOLD_']} ['a', 'b']"]


def test_an_error_in_the_measuring_process_is_raised_here_as_itself_with_its_traceback_as_a_note():
    with pytest.raises(ConfigError) as caught:  # (pytest's match= would also search the notes)
        memory.peak(functools.partial(failing_setup, "hpcdl"))
    assert str(caught.value) == "model.depth must be >= 1, got 0"
    assert caught.value.exit_code == 2  # the command reports it in one line, as an error in the user's input
    (note,) = caught.value.__notes__
    assert note.startswith("raised in the measuring process:") and "in failing_setup" in note
    with pytest.raises(RuntimeError) as caught:
        memory.peak(functools.partial(failing_setup, "unpicklable"))
    assert str(caught.value) == "TwoArgumentError: the step: failed" and "in failing_setup" in caught.value.__notes__[0]


@pytest.mark.slow
def test_compression_lowers_the_measured_peak_of_a_training_step():
    with memory.MeasuringProcess() as process:  # one process serves both measurements
        baseline = memory.peak(memory.TrainStep(SMALL_CNN, 16, None), process=process)
        compressed = memory.peak(memory.TrainStep(SMALL_CNN, 16, "sz:rel=1e-2"), process=process)
    saved_per_sample = 6 * 2 * 8 * 32 * 32 * 4  # six conv+BN+ReLU layers save two float maps each
    assert baseline.peak_bytes > 16 * saved_per_sample
    assert compressed.activation_ratio > 4
    assert baseline.peak_bytes / compressed.peak_bytes > 1.8  # measured 2.4 (7.5 MiB -> 3.2 MiB)


@pytest.mark.slow
def test_search_finds_the_largest_batch_whose_measured_peak_fits():
    budget = 6 * MiB
    with memory.MeasuringProcess() as process:
        found = memory.search_batch(SMALL_CNN, None, budget, start=4, limit=64, process=process)
        at_limit = memory.search_batch(SMALL_CNN, None, "6MiB", start=2, limit=3, process=process)
    probes = dict(found.probes)
    assert found.batch_size >= 4 and not found.hit_limit
    assert probes[found.batch_size].peak_bytes <= budget < probes[found.batch_size + 1].peak_bytes
    assert found.peak_bytes == probes[found.batch_size].peak_bytes
    assert at_limit.batch_size == 3 and at_limit.hit_limit and [b for b, _ in at_limit.probes] == [2, 3]


@pytest.mark.parametrize("start", [1, 5, 19, 20, 21, 40, 64])
def test_the_search_brackets_the_answer_from_any_start_and_in_two_probes_from_the_answer(start):
    """Probes move away from the start in steps of 1, 2, 4, ...: from 1 they double (1, 2, 4, 8, ...), from the
    answer they cost two probes, from above they step down; every search ends on the largest fitting batch."""
    fits_up_to = 20
    probed: list[int] = []

    def fits(batch: int) -> bool:
        probed.append(batch)
        return batch <= fits_up_to

    good, bad = search._bracket(fits, start, limit=64)
    assert good <= fits_up_to < bad and good in probed and bad in probed
    if start == 1:
        assert probed == [1, 2, 4, 8, 16, 32]
    if start == fits_up_to:
        assert probed == [20, 21]
    if start == fits_up_to + 1:
        assert probed == [21, 20]
    assert search._bracket(lambda batch: True, start, limit=64) == (64, None)  # every batch up to the limit fits
    assert search._bracket(lambda batch: False, start, limit=64) == (0, 1)  # none fits: 1 was probed


def test_a_budget_below_one_sample_is_refused():
    with pytest.raises(ValueError, match="smaller than the measured peak of one sample"):
        memory.max_batch(SMALL_CNN, None, 64 * 1024)


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="setup callable"):
        memory.peak(42)
    with pytest.raises(ValueError, match="pass batch="):
        memory.Workload("runtime_models:wide_cnn").build(2, 0)
    with pytest.raises(ValueError, match="cannot load model"):
        memory.Workload("runtime_models:nope", batch="runtime_models:wide_cnn_batch").build(2, 0)
    with pytest.raises(ValueError, match="batch_size"):
        memory.TrainStep(SMALL_CNN, 0)
    with pytest.raises(ValueError, match="size"):
        memory.max_batch(SMALL_CNN, None, "lots")
    with pytest.raises(ValueError, match="start <= limit"):
        memory.max_batch(SMALL_CNN, None, "1GiB", start=8, limit=4)


@pytest.mark.slow
def test_batch_size_command_prints_baseline_and_policy(capsys):
    code = main([
        "batch-size", "--model", "runtime_models:wide_cnn", "--batch-fn", "runtime_models:wide_cnn_batch",
        "--budget", "24MiB", "--policy", "raw", "--start", "2", "--limit", "2", "--threshold", "0",
    ])
    out = capsys.readouterr().out
    assert code == 0
    assert "baseline" in out and "raw" in out and "max batch" in out and "peak ratio" in out and "activation ratio" in out


def test_batch_size_command_reports_bad_input(capsys):
    assert main(["batch-size", "--model", "runtime_models:wide_cnn", "--budget", "1GiB", "--policy", "nope:x=1"]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_peak_on_cuda_uses_the_allocator():
    baseline = memory.peak(memory.TrainStep(SMALL_CNN, 16, None, device="cuda"))
    compressed = memory.peak(memory.TrainStep(SMALL_CNN, 16, "sz:rel=1e-2", device="cuda"))
    assert baseline.method == "cuda_max_allocated" and baseline.peak_bytes > 0
    assert compressed.peak_bytes < baseline.peak_bytes


def test_learning_steps_are_passed_over_and_their_peak_kept():
    report = memory.peak(learning_then_usual_setup)  # a fresh, allocator-tuned process, as every CPU peak
    assert report.info["learning_steps"] == 2 and report.info["observed_gradients"] is False
    assert 7 * MiB <= report.peak_bytes < 12 * MiB  # the usual step's 8 MiB
    assert 63 * MiB <= report.info["learning_peak_bytes"] < 70 * MiB
    assert report.worst_bytes == report.info["learning_peak_bytes"]


@pytest.mark.slow
def test_an_adaptive_policy_is_measured_on_a_compressed_step_and_on_its_first_probe():
    with memory.MeasuringProcess() as process:
        adaptive = memory.peak(memory.TrainStep(SMALL_CNN, 16, "adaptive"), process=process)
    assert adaptive.info["observed_gradients"] is False
    assert adaptive.activation_ratio > 2  # the measured step compressed with the probe's decisions
    # the first probe (a rehearsal in the warm-up, then measured): what a batch search must also fit
    assert adaptive.info["learning_steps"] == 1 and adaptive.info["learning_peak_bytes"] > adaptive.peak_bytes
    assert adaptive.worst_bytes == adaptive.info["learning_peak_bytes"]


def test_a_method_whose_first_step_learns_rehearses_it_once_warm_up_is_one_step():
    step = memory.TrainStep(SMALL_CNN, 4, "adaptive:probe_every=50")()
    assert [step()["observed_gradients"] for _ in range(3)] == [True, True, False]  # the probe, again, then usual
    longer = memory.TrainStep(SMALL_CNN, 4, "adaptive:probe_every=50", warmup_steps=2)()  # probed in the setup
    assert [longer()["observed_gradients"] for _ in range(2)] == [False, False]
    static = memory.TrainStep(SMALL_CNN, 4, "sz:rel=1e-2")()
    assert [static()["observed_gradients"] for _ in range(2)] == [False, False]
