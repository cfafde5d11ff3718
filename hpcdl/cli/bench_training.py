"""``hpcdl bench training``: baseline vs compressed at one memory budget (see hpcdl/bench/training.py)."""

from __future__ import annotations

import argparse


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "training", help="per-device batch, samples/s and 1->2 rank scaling, baseline vs sz, at one memory budget",
        description="For the climate and HEP models: the largest per-device batch whose measured step peak fits a "
                    "memory budget, baseline and the default policy; samples/s at that batch on 1 rank and under "
                    "mpirun -np 2 (one thread per rank); scaling efficiency. Prints a table, writes JSON.")
    parser.add_argument("--out", default="runs/bench-training", help="directory for the runs and bench.json")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per run (default 5)")
    parser.add_argument("--ranks", default="1,2", help="comma-separated rank counts (default 1,2)")
    parser.add_argument("--budget", action="append", default=[], metavar="WORKLOAD=SIZE",
                        help="memory budget per workload, e.g. climate-deeplab=64MiB (repeatable)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpcdl.bench.training import WORKLOADS, format_rows, run_training_benchmark, write_rows

    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    try:
        ranks = tuple(int(n) for n in args.ranks.split(","))
    except ValueError:
        raise ValueError(f"--ranks is a comma-separated list of rank counts like 1,2; got {args.ranks!r}") from None
    if 1 not in ranks or min(ranks) < 1:
        raise ValueError(f"--ranks must include 1 (the scaling baseline) and be >= 1, got {args.ranks!r}")
    budgets = {}
    for item in args.budget:
        workload, equals, size = item.partition("=")
        if not equals or workload not in WORKLOADS:
            raise ValueError(f"--budget is WORKLOAD=SIZE with WORKLOAD one of {', '.join(WORKLOADS)}; got {item!r}")
        budgets[workload] = size
    rows = run_training_benchmark(args.out, budgets=budgets, steps=args.steps, ranks=ranks)
    print(format_rows(rows))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_rows(rows, Path(args.out) / "bench.json")
    print(f"\nwritten: {Path(args.out) / 'bench.json'}")
    return 0
