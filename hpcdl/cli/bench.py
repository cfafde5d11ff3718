"""``hpcdl bench ...``: benchmark commands that print (and write as JSON) what they measure.

This module registers ``hpcdl bench codecs``. Another benchmark joins the group from its own module: name it
in ``BENCH_SUBCOMMAND_MODULES`` and give it ``register(bench_subparsers)``, which adds one subcommand with
``bench_subparsers.add_parser(...)`` and ``set_defaults(handler=fn)``, importing heavy modules inside ``fn``
(as the top-level command modules do). A listed module that does not exist yet is skipped.
"""

from __future__ import annotations

import argparse
import importlib

from hpcdl.cli import thread_count

BENCH_SUBCOMMAND_MODULES = ("hpcdl.cli.bench_training", "hpcdl.cli.bench_memory", "hpcdl.cli.bench_gradients")


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks: codecs, training, memory, gradients",
                                   description="Benchmark commands that print (and write as JSON) what they measure.")
    bench_subparsers = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    _register_codecs(bench_subparsers)
    for name in BENCH_SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            continue
        module.register(bench_subparsers)


def _register_codecs(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "codecs",
        help="compression ratio, error and GB/s of every codec on saved activations",
        description="Capture the activations a ResNet-18 and a ViT save for backward on natural-looking images, "
        "then encode and decode them with sz, sz3 and zfp at each rel bound, quant at 2/4/8 bits and cast "
        "to bf16; print a table (ratio, max error / bound, compress and decompress GB/s, memcpy GB/s) "
        "and write it as JSON.",
    )
    parser.add_argument("--out", default=None, help="write the JSON report here (default: print only)")
    parser.add_argument("--bounds", type=parse_bounds, default=None,
                        help="comma-separated rel error bounds (default 1e-1,1e-2,1e-3)")
    parser.add_argument("--quick", action="store_true", help="tiny models and batches, one repeat: a smoke run")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timing repeats; the best is reported (default 3, or 1 with --quick)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda; sz3 and zfp run on CPU only")
    parser.add_argument("--seed", type=int, default=0, help="seed for the model weights and input images")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch (and sz host kernel) threads for the run (default: torch's current setting)")
    parser.add_argument("--codecs", type=parse_codec_ids, default=(),
                        help="comma-separated codec ids to run, e.g. sz,cast (default: all)")
    parser.add_argument("--load", type=int, default=0,
                        help="busy processes (one torch thread each) running beside the measurements, as a "
                        "training job's other threads would (default 0: an otherwise idle machine)")
    parser.set_defaults(handler=run_codecs)


def parse_codec_ids(text: str) -> tuple[str, ...]:
    """``"sz,cast"`` -> ("sz", "cast"); the benchmark checks the ids."""
    ids = tuple(item.strip() for item in text.split(",") if item.strip())
    if not ids:
        raise argparse.ArgumentTypeError(f"name at least one codec id, e.g. sz,cast; got {text!r}")
    return ids


def parse_bounds(text: str) -> tuple[float, ...]:
    """``"1e-1,1e-2"`` -> (0.1, 0.01); each bound a finite number > 0."""
    bounds = []
    for item in text.split(","):
        try:
            bound = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not a number; write bounds like 1e-1,1e-2,1e-3") from None
        if not 0 < bound < float("inf"):
            raise argparse.ArgumentTypeError(f"each bound must be a finite number > 0, got {item!r}")
        bounds.append(bound)
    return tuple(bounds)


def run_codecs(args) -> int:
    import sys

    from hpcdl.bench.codecs import DEFAULT_BOUNDS, format_report, run_codec_benchmark, write_report

    if args.device != "cpu" and not args.device.startswith("cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {args.device!r}")
    report = run_codec_benchmark(
        bounds=args.bounds or DEFAULT_BOUNDS,
        quick=args.quick,
        repeats=args.repeats,
        device=args.device,
        seed=args.seed,
        threads=args.threads,
        only=args.codecs,
        load=args.load,
        progress=lambda label: print(f"  running {label}", file=sys.stderr, flush=True),
    )
    print(format_report(report))
    if args.out:
        print(f"wrote {write_report(report, args.out)}")
    return 0
