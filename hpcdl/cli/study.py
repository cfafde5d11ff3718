"""``hpcdl study run``, ``report`` and ``matched-bits``: the impact study of activation-memory methods."""

from __future__ import annotations

import argparse

from hpcdl.cli import thread_count


def _csv(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def _seeds(text: str) -> list[int]:
    try:
        return [int(item) for item in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes integers like 0,1, got {text!r}") from None


def _batch(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch takes an integer or 'auto', got {text!r}") from None


def register(subparsers) -> None:
    study = subparsers.add_parser(
        "study", help="the impact study: methods x models, accuracy/memory/speed, and its report",
        description="Train models with each activation-memory method and compare validation metric, memory and "
                    "speed against the baseline of the same seed.")
    commands = study.add_subparsers(dest="study_command", metavar="SUBCOMMAND", required=True)

    run = commands.add_parser(
        "run", help="run (or resume) a sweep, appending one JSON line per run to OUT/results.jsonl",
        epilog="With --shard i/n (n > 1) the shard appends to OUT/results-shard<i>of<n>.jsonl, so array tasks "
               "never share a file; `hpcdl study report` reads them all.",
        description="Runs every (model, seed, method) not yet finished in OUT/results.jsonl through the trainer. "
                    "Methods: baseline, recompute (activation checkpointing; old name checkpoint), offload (GPU "
                    "only; recorded as skipped elsewhere), or a codec spec such as sz:rel=1e-2, sz:abs=1e-3, "
                    "quant:bits=2, cast:bf16.")
    run.add_argument("--models", type=_csv, required=True, help="comma-separated model names (see `hpcdl models`)")
    run.add_argument("--methods", required=True,
                     help="comma-separated methods, e.g. baseline,sz:rel=1e-2,quant:bits=2,cast:bf16,recompute")
    run.add_argument("--seeds", type=_seeds, default=[0], help="comma-separated seeds (default 0)")
    run.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    run.add_argument("--steps-per-epoch", type=int, default=None, help="cap on optimizer steps per epoch")
    run.add_argument("--batch", type=_batch, default=None,
                     help="global batch (integer or auto); default: each model's base config")
    run.add_argument("--scale", default=None, help="model scale for every model (default: each model's smallest)")
    run.add_argument("--config", default=None,
                     help="base trainer config for every model (default: the model's CPU shipped config)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="extra trainer config override for every run (repeatable)")
    run.add_argument("--out", required=True, help="study directory; results.jsonl and run directories go here")
    run.add_argument("--shard", default="0/1", metavar="I/N",
                     help="run only shard I of N (I from 0; e.g. $SLURM_ARRAY_TASK_ID/N); default 0/1")
    run.add_argument("--threads", type=thread_count, default=None,
                     help="torch CPU threads per process (default: torch's choice); 1 steadies step times on a "
                          "busy machine")
    run.add_argument("--retry-failed", action="store_true", help="run again the runs recorded as failed")
    run.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    run.set_defaults(handler=_run)

    report = commands.add_parser("report", help="write DIR/report.md and its PNG plots from DIR/results.jsonl")
    report.add_argument("dir", help="study directory (holding results.jsonl)")
    report.set_defaults(handler=_report)

    matched = commands.add_parser(
        "matched-bits", help="print the average bits per saved element that hold what adaptive held on a model",
        description="ACTIVATION_BITS / (adaptive's activation ratio after its first decision, mean over seeds), "
                    "from DIR's results: the bits of an ActNN-style baseline at adaptive's byte budget, e.g. "
                    "--methods \"actnn:bits=$(hpcdl study matched-bits DIR --model hep-cnn)\".")
    matched.add_argument("dir", help="study directory (holding results.jsonl)")
    matched.add_argument("--model", required=True, help="the model whose adaptive runs to match")
    matched.add_argument("--method", default=None,
                         help="the adaptive method spec, when several ran on the model (e.g. adaptive:alpha=1e-3)")
    matched.add_argument("--activation-bits", type=int, default=32,
                         help="bits per element of the activations as saved (32 for fp32; default 32)")
    matched.set_defaults(handler=_matched_bits)


def _run(args) -> int:
    from hpcdl.study.results import results_path
    from hpcdl.study.sweep import parse_shard, plan_sweep, run_sweep, shard

    if args.epochs < 1:
        raise ValueError(f"--epochs must be >= 1, got {args.epochs}")
    if args.steps_per_epoch is not None and args.steps_per_epoch < 1:
        raise ValueError(f"--steps-per-epoch must be >= 1, got {args.steps_per_epoch}")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    index, count = parse_shard(args.shard)
    runs = plan_sweep(args.models, args.methods, args.seeds, args.epochs, batch=args.batch, scale=args.scale,
                      steps_per_epoch=args.steps_per_epoch, base_config=args.config, extra=args.overrides)
    mine = shard(runs, index, count)
    summary = run_sweep(mine, args.out, progress=args.progress, retry_failed=args.retry_failed,
                        shard=(index, count))
    print(f"study shard {index}/{count}: {len(mine)} of {len(runs)} runs; ran {len(summary.ran)}, "
          f"skipped {len(summary.skipped)}, failed {len(summary.failed)}, already done {len(summary.already_done)}, "
          f"single-step peaks measured {summary.step_peaks}; "
          f"results in {results_path(args.out, (index, count))}")
    for path in summary.truncated:
        print(f"note: {path} ended in an unfinished line (a run killed while writing); it was left as is and "
              "the records after it start on a fresh line")
    return 1 if summary.failed else 0


def _report(args) -> int:
    from hpcdl.study.report import write_report

    path = write_report(args.dir)
    print(f"wrote {path}")
    return 0


def _matched_bits(args) -> int:
    from hpcdl.study.results import read_results
    from hpcdl.study.targets import matched_bits

    print(f"{matched_bits(read_results(args.dir).runs(), args.model, args.method, args.activation_bits):g}")
    return 0
