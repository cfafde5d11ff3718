"""The ``hpcdl`` command. Thin: each subcommand parses its arguments and calls one public function.

Every command group lives in its own module here and adds its parsers through
``register(subparsers)``; heavy imports happen inside the handlers so that
``hpcdl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from hpcdl import __version__

COMMAND_MODULES = ("demo", "bench", "memory", "data", "models", "train", "export", "slurm", "study")
DEBUG_HELP = "show tracebacks instead of one-line errors, and debug log messages"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcdl",
        description="Data-parallel training with error-bounded lossy compression of activations.",
    )
    parser.add_argument("--version", action="version", version=f"hpcdl {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"hpcdl.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"hpcdl.cli.{name}":
                raise
            continue
        module.register(subparsers)
    _add_debug(subparsers)
    return parser


def _add_debug(subparsers: argparse._SubParsersAction) -> None:
    """Every command, at any depth, takes ``--debug`` (before or after its arguments), defined once here.

    Its default is SUPPRESS so that ``hpcdl --debug train ...`` is not reset by the subcommand's parser.
    """
    for command in set(subparsers.choices.values()):
        nested = [action for action in command._actions if isinstance(action, argparse._SubParsersAction)]
        for action in nested:
            _add_debug(action)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)


def configure_logging(debug: bool) -> None:
    """Send the ``hpcdl`` loggers' messages to stderr: INFO and up, or DEBUG and up with ``--debug``."""
    logger = logging.getLogger("hpcdl")
    if not any(getattr(handler, "_hpcdl_cli", False) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s hpcdl %(levelname)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
        handler._hpcdl_cli = True
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)


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
    configure_logging(args.debug)
    try:
        return int(args.handler(args) or 0)
    except USAGE_ERRORS + RUN_ERRORS as err:
        if args.debug:
            raise
        print(error_line(args.command, err), file=sys.stderr)
        return 2 if isinstance(err, USAGE_ERRORS) else 1


if __name__ == "__main__":
    sys.exit(main())
