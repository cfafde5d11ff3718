"""``hpcdl bench gradients``: the gradient cosine of each policy on every zoo model (see hpcdl/bench/gradients.py)."""

from __future__ import annotations

import argparse

from hpcdl.cli import thread_count


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "gradients", help="gradient cosine to exact and compression ratio of each policy, on every zoo model",
        description="For each model (random weights, a random batch of its real input shape at --scale) run one "
                    "forward and backward exactly and under each policy (same weights, input and dropout masks; "
                    "a probing policy such as adaptive runs until a step compresses) and report the cosine of the "
                    "parameter gradients to the exact ones, the worst module's cosine and the activation "
                    "compression ratio. Prints a table; writes bench-gradients.json and .txt to --out after "
                    "every model.")
    parser.add_argument("--models", default="all",
                        help="comma-separated hpcdl.models names, or all (default: every model of `hpcdl models`)")
    parser.add_argument("--scale", default="full", help="model scale: tiny, small or full (default full: the "
                                                        "published configuration at its real input size)")
    parser.add_argument("--batch", type=int, default=2, help="samples per batch (default 2)")
    parser.add_argument("--policies", default=None,
                        help="method specs separated by commas (or by ; when a spec has commas); 'default' names "
                             "hpcdl's default policy (default: hpcdl.bench.gradients.DEFAULT_POLICIES, "
                             "sz:rel=1e-2,sz:rel=1e-3,adaptive)")
    parser.add_argument("--cases", default="batchnorm,attention",
                        help="issue 13's reproductions to run first, comma-separated, or none "
                             "(default batchnorm,attention)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, the batch and dropout (default 0)")
    parser.add_argument("--threads", type=thread_count, default=None, help="torch threads (default: torch's setting)")
    parser.add_argument("--out", default="runs/bench-gradients", help="directory for bench-gradients.json and .txt")
    parser.set_defaults(handler=_run)


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip() and name.strip() != "none"]


def _run(args: argparse.Namespace) -> int:
    import sys

    from hpcdl.bench.gradients import (
        DEFAULT_POLICIES,
        format_report,
        parse_policies,
        run_gradient_benchmark,
        write_report,
    )
    from hpcdl.models import names

    models = names() if args.models == "all" else _names(args.models)
    policies = parse_policies(args.policies or ",".join(DEFAULT_POLICIES))
    report = run_gradient_benchmark(
        models, args.scale, args.batch, policies, cases=_names(args.cases), seed=args.seed,
        threads=args.threads, progress=lambda line: print(line, file=sys.stderr, flush=True),
        on_result=lambda partial: write_report(partial, args.out))
    print(format_report(report))
    json_path, text_path = write_report(report, args.out)
    print(f"\nwritten: {json_path}, {text_path}")
    return 0
