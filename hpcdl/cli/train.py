"""``hpcdl train CONFIG [--set KEY=VALUE ...] [--resume [RUN]]`` and ``hpcdl configs``.

``hpcdl train`` exits 0 when the run finished and 75 (:data:`hpcdl.train.signals.EXIT_CHECKPOINTED`) when
SIGUSR1 or SIGTERM stopped it after writing a checkpoint that ``--resume`` continues from.
"""

from __future__ import annotations

import argparse
import logging


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train", help="train a model from a config (a shipped name or a YAML path)",
        description="Train a model from a config: a shipped config name (see `hpcdl configs`) or a YAML file. "
                    "Run under mpirun/srun/horovodrun for data parallelism.")
    train.add_argument("config", help="shipped config name (e.g. climate-deeplab) or path to a YAML file")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set train.epochs=3 (repeatable; values are YAML)")
    train.add_argument("--run-dir", help="write here instead of logging.out_dir/<name>-<timestamp>")
    train.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN",
                       help="continue from the latest checkpoint: of RUN (a run directory or checkpoint file), "
                            "or of the newest run of this config under logging.out_dir")
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    train.set_defaults(handler=_train)

    configs = subparsers.add_parser("configs", help="list the shipped training configs",
                                    description="List the shipped training configs with their descriptions.")
    configs.set_defaults(handler=_configs)


def _configs(args: argparse.Namespace) -> int:
    from hpcdl.train.config import shipped_configs

    listing = shipped_configs()
    width = max(len(name) for name in listing)
    for name, description in listing.items():
        print(f"{name.ljust(width)}  {description}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from hpcdl.train.signals import EXIT_CHECKPOINTED, TrainingInterrupted, hold_stop_signals

    hold_stop_signals()  # first: loading torch, the data and the model takes seconds a signal may fall into
    from hpcdl.train import load_config, run_training
    from hpcdl.train.config import dump_config
    from hpcdl.train.summary import format_summary

    config = load_config(args.config, overrides=args.overrides)
    if args.print_config:
        print(dump_config(config), end="")
        return 0
    try:
        result = run_training(config, run_dir=args.run_dir, resume=args.resume)
    except TrainingInterrupted as stopped:
        logging.getLogger("hpcdl").warning("%s", stopped)
        return EXIT_CHECKPOINTED
    if result.rank == 0:
        print(format_summary(result))
    return 0
