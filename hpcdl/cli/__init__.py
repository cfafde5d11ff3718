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


# Errors of what the user gave (a config, a value, a path): one line and exit code 2, like argparse's own.
# OverflowError is here because Python raises it for numbers too large to use (a value like 1e400).
USAGE_ERRORS = (ValueError, TypeError, OverflowError, OSError)
# Errors of a run that started correctly (the loss became NaN): one line and exit code 1.
RUN_ERRORS = (ArithmeticError,)


def error_line(command: str, err: BaseException) -> str:
    """``hpcdl <command>: error: <message>`` on one line, whatever the exception's message holds."""
    message = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename is not None and str(err.filename) not in message:
        message += f": {err.filename}"
    return f"hpcdl {command}: error: {message}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except USAGE_ERRORS + RUN_ERRORS as err:
        if getattr(args, "debug", False):
            raise
        print(error_line(args.command, err), file=sys.stderr)
        return 2 if isinstance(err, USAGE_ERRORS) else 1


if __name__ == "__main__":
    sys.exit(main())
