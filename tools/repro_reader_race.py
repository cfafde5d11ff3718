"""Reproduce the reader race of issue 9: data sets dropped with open netCDF4/HDF5 handles, while a
later loader's prefetch thread reads.

What the demo did, without the models: each "run" opens a train and a val split of a committed
sample, iterates a few batches of a prefetching ``ShardedLoader`` (stopping early, as the trainer
does with ``train.steps_per_epoch``), reads some validation items in the main thread, and drops
everything. A ``netCDF4.Dataset`` sits in a reference cycle with its Variables and Dimensions, so
only the garbage collector frees it, in whichever thread it runs; here a third thread runs
``gc.collect()`` in a loop, as allocation-triggered collections do at random in the real trainer.

    python tools/repro_reader_race.py --trials 20          # each trial in a fresh subprocess (climate)
    python tools/repro_reader_race.py --once --runs 30     # one trial in this process

A trial fails if it raises, or if its process dies of a signal (SIGSEGV/SIGBUS/SIGABRT); the
driver prints the count of failed trials.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import threading


def one_trial(runs: int, names: list[str], pause: float = 0.0) -> None:
    from hpcdl.data import ShardedLoader, load_dataset

    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            gc.collect()
            if pause:
                stop.wait(pause)  # lets the other threads have the interpreter between collections

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    try:
        for run in range(runs):
            name = names[run % len(names)]
            train, val = load_dataset(name, split="train"), load_dataset(name, split="val")
            loader = ShardedLoader(train, batch_size=4, seed=run, prefetch=2)
            for step, _ in enumerate(loader):
                for item in range(step % len(val), len(val), 7):
                    val[item]
                if step == 3:
                    break
            del train, val, loader
    finally:
        stop.set()
        collector.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--runs", type=int, default=30, help="open/iterate/drop cycles per trial")
    parser.add_argument("--data", nargs="+", default=["climate-sample"])
    parser.add_argument("--once", action="store_true", help="run one trial in this process")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds between the collector's collections (0: back to back, which holds the "
                             "interpreter lock most of the time and slows every other thread)")
    args = parser.parse_args()
    if args.once:
        one_trial(args.runs, args.data, args.pause)
        return 0
    failed = 0
    for trial in range(args.trials):
        command = [sys.executable, __file__, "--once", "--runs", str(args.runs), "--pause", str(args.pause),
                   "--data", *args.data]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            code, tail = done.returncode, (done.stderr.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            code, tail = "timeout", f"no result within {args.timeout} s (deadlock?)"
        if code != 0:
            failed += 1
        print(f"trial {trial}: {'ok' if code == 0 else f'FAILED ({code}): {tail}'}", flush=True)
    print(f"{failed}/{args.trials} trials failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
