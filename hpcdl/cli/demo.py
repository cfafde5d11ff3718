"""``hpcdl demo``: the first thing a new user runs (see hpcdl/demo.py)."""

from __future__ import annotations

import argparse
import time


def register(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo", help="train the climate and HEP models, baseline vs compressed activations, and compare",
        description="Train the climate (DeepLabv3+) and HEP (jet-image CNN) models on the committed samples, "
                    "without and with activations compressed by the default policy, then measure the largest batch that "
                    "fits a small memory budget. Takes about a minute or two on 2 CPU cores.")
    demo.add_argument("--out", default="runs/demo", help="where the run directories go (default: runs/demo)")
    demo.add_argument("--epochs", type=int, default=2, help="epochs per run (default: 2)")
    demo.add_argument("--steps-per-epoch", type=int, default=10,
                      help="cap on steps per epoch (default 10; the HEP sample has 37 batches per epoch)")
    demo.add_argument("--budget", default=None,
                      help="memory budget for the batch search, e.g. 256MiB (default: each config's "
                           "train.memory_budget)")
    demo.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    from hpcdl.demo import elapsed_line, format_table, run_demo

    if args.epochs < 1:
        raise ValueError(f"--epochs must be >= 1, got {args.epochs}")
    rows, missing = run_demo(args.out, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, budget=args.budget)
    print(format_table(rows, missing))
    print(elapsed_line(time.monotonic() - started))
    return 1 if missing else 0
