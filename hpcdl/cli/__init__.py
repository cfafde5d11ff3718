"""The ``hpcdl`` command. Thin: each subcommand parses its arguments and calls one public function.

Every command group lives in its own module here and adds its parsers through
``register(subparsers)``; heavy imports happen inside the handlers so that
``hpcdl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = ("demo", "bench", "memory", "data", "models", "train", "slurm", "study")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcdl",
        description="Data-parallel training with error-bounded lossy compression of activations.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"hpcdl.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"hpcdl.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as err:
        if getattr(args, "debug", False):
            raise
        print(f"hpcdl {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
