"""Stress: the demo's sequence of trainings and batch searches, 20 times in one process, and the reader churn
that made it fail (issue 9: 'climate_0002.nc: cannot be read as netCDF4 (NetCDF: HDF error)',
SIGSEGV/SIGBUS/SIGABRT in the second climate training). Before the I/O owner thread the churn
failed in 20 of 20 trials (tools/repro_reader_race.py)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPRO = Path(__file__).resolve().parents[1] / "tools" / "repro_reader_race.py"


@pytest.mark.slow
def test_reader_churn_with_a_collector_thread_never_fails():
    """20 open/iterate-partly/drop cycles of climate and HEP loaders while another thread runs the
    garbage collector every millisecond, in a subprocess so that a crash fails the test rather than pytest.

    The repro's default, a collector running back to back, is what failed 20 of 20 trials before the
    owner thread; it also holds the interpreter lock nearly all the time, so every hand-over to the
    owner waits for it and 20 cycles take minutes (4.5 min for 8 on an idle 2-core machine). A 1 ms
    pause keeps collections at random points of the reads and the test to about 30 s."""
    done = subprocess.run([sys.executable, str(REPRO), "--once", "--runs", "20", "--pause", "0.001", "--data",
                           "climate-sample", "hep-sample"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


def _collect_until(stop: threading.Event, collections: list[int]) -> None:
    while not stop.wait(0.005):
        gc.collect()
        collections[0] += 1


@pytest.mark.slow
def test_demo_sequence_twenty_times_in_one_process_with_a_collector_thread(tmp_path):
    """The demo's own sequence (hpcdl.demo.run_demo: climate then HEP, baseline and sz, each training followed
    by its batch search) 20 times in one process, while another thread runs the garbage collector every 5 ms,
    so that the datasets of one run are collected at random points of the next run's reads: the race that
    made the second climate training fail.

    Cut to what the demo accepts at its smallest: 1 epoch of 1 step, and a batch search capped at batch 1
    (``limit=1``) in one measuring process shared by all searches (``process=``). A first sequence runs
    before the collector starts: it imports what the runs import lazily, and ``gc.freeze()`` after it keeps
    those objects out of every later collection (a full collection of them takes 0.2 s, which would make
    the collector hold the interpreter lock nearly all the time); what the runs create is still collected.
    """
    from hpcdl.demo import WORKLOADS, run_demo
    from hpcdl.memory import MeasuringProcess

    def one_sequence(repeat: int) -> None:
        rows, missing = run_demo(tmp_path / str(repeat), epochs=1, steps_per_epoch=1, progress=False,
                                 search_options={"limit": 1, "process": probes})
        assert missing == {} and [row.workload for row in rows] == [w for w in WORKLOADS for _ in range(2)]
        assert all(row.steps == 1 and row.max_batch == 1 for row in rows)

    stop, collections = threading.Event(), [0]
    collector = threading.Thread(target=_collect_until, args=(stop, collections), daemon=True)
    with MeasuringProcess(threads=1) as probes:
        one_sequence(0)
        gc.collect()
        gc.freeze()
        collector.start()
        try:
            for repeat in range(1, 21):
                one_sequence(repeat)
        finally:
            stop.set()
            collector.join()
            gc.unfreeze()
    assert collections[0] > 20, "the collector thread must have run during the sequences"
