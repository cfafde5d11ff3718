"""``hpcdl bench memory``: measured step peaks of activation methods, per batch and under budgets (see hpcdl/bench/memory.py)."""

from __future__ import annotations

import argparse

from hpcdl.cli import thread_count


def register(bench_subparsers) -> None:
    from hpcdl.bench.memory import DEFAULT_METHODS  # a constant of a module that imports no torch at load

    parser = bench_subparsers.add_parser(
        "memory", help="step peak per batch of each activation method, the largest batch per budget, a GPU projection",
        description="For one model: the measured training-step peak at each --batches size for each method (every "
                    "probe in a new measuring process on the CPU), its breakdown, the per-sample peak and its ratio "
                    "to the baseline, the largest batch within each --budgets size, and a projection of the largest "
                    "per-GPU batch on A100 40/80 GB and H200 141 GB. Prints tables; writes bench-memory.json and "
                    "bench-memory.png to --out (the JSON after every probe too, marked incomplete until the end).")
    parser.add_argument("--model", required=True, help="an hpcdl.models name, e.g. deeplabv3p-climate (see `hpcdl models`)")
    parser.add_argument("--scale", default="small", help="model scale: tiny, small or full (default small)")
    parser.add_argument("--input-shape", default=None, metavar="CxHxW",
                        help="per-sample input shape replacing the scale's, e.g. 16x768x1152 (default: the scale's)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a model constructor option (repeatable; the value is read as YAML), e.g. in_channels=16")
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help=f"comma-separated method specs (default {DEFAULT_METHODS})")
    parser.add_argument("--batches", default="1,2", help="comma-separated batch sizes to measure (default 1,2)")
    parser.add_argument("--budgets", default="",
                        help="comma-separated memory budgets for the batch search, e.g. 256MiB,1GiB (default none)")
    parser.add_argument("--limit", type=int, default=1 << 16, help="largest batch a search tries (default 65536)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--threads", type=thread_count, default=None, help="torch threads in each measuring process")
    parser.add_argument("--warmup-steps", type=int, default=1,
                        help="steps each probe runs before the measured one (default 1); more for a method whose "
                             "usual step comes later, e.g. an adaptive policy after a few probes")
    parser.add_argument("--out", default="runs/bench-memory", help="directory for bench-memory.json and .png")
    parser.set_defaults(handler=_run)


def _options(items: list[str]) -> dict:
    import yaml

    from hpcdl.bench.memory import MemoryBenchError

    options = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise MemoryBenchError(f"--option is KEY=VALUE, e.g. in_channels=16; got {item!r}")
        options[key] = yaml.safe_load(value)
    return options


def _run(args: argparse.Namespace) -> int:
    import sys

    from hpcdl.bench.memory import (
        format_report,
        parse_batches,
        parse_budgets,
        parse_input_shape,
        run_memory_benchmark,
        write_json,
        write_report,
    )
    from hpcdl.train.method_spec import parse_methods

    parse_methods(args.methods)  # refuse a bad list before anything is measured
    batches, budgets = parse_batches(args.batches), parse_budgets(args.budgets)
    report = run_memory_benchmark(
        args.model, args.scale, methods=args.methods, batches=batches, budgets=budgets,
        input_shape=parse_input_shape(args.input_shape), options=_options(args.option), device=args.device,
        threads=args.threads, limit=args.limit, warmup_steps=args.warmup_steps,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        partial=lambda so_far: write_json(so_far, args.out))
    print(format_report(report))
    json_path, png_path = write_report(report, args.out)
    print(f"\nwritten: {json_path}, {png_path}")
    return 0
