"""The ``hpcdl`` command. Thin: each subcommand parses its arguments and calls one public function.

Every command group lives in its own module here and adds its parsers through
``register(subparsers)``; heavy imports happen inside the handlers so that
``hpcdl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import sys

from hpcdl import __version__
from hpcdl.errors import HpcdlError

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
        # A command module that fails to import is a broken installation: the error propagates instead of the
        # command silently disappearing from `hpcdl --help`.
        importlib.import_module(f"hpcdl.cli.{name}").register(subparsers)
    _add_debug(subparsers)
    return parser


def thread_count(text: str) -> int:
    """The argparse type of every ``--threads``: a whole number of threads, at least 1 (torch would refuse 0 or
    less with a traceback, and a measuring process would die of it)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of threads >= 1, got {text!r}")
    return value


def check_command(argv: list[str]) -> None:
    """Raise ValueError saying why when ``hpcdl argv`` would not parse (e.g. a Slurm job's command line)."""
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages), contextlib.redirect_stdout(messages):
            build_parser().parse_args(argv)
    except SystemExit:
        last = messages.getvalue().strip().splitlines()
        raise ValueError(last[-1] if last else "it does not parse") from None


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
        handler._hpcdl_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)


# NOTE [ exit codes ]
# Every error hpcdl raises on purpose is an HpcdlError whose ``exit_code`` says what it means: 2 for what the
# user gave (a config, a value, a path), like argparse's own usage errors; 1 for a run that started correctly
# and failed (hpcdl.errors.HpcdlRunError). Builtin errors that are still genuinely the user's input: a
# ValueError from a check not yet given its own class, OverflowError (Python's for numbers too large to use,
# like 1e400) and the OSErrors of a path the user named (it does not exist, is a directory or is not, cannot
# be read or written): exit 2. Other OSErrors are the machine failing a run (a full disk, an I/O error, a
# job that timed out): exit 1, as is ArithmeticError other than OverflowError (the loss became NaN:
# FloatingPointError). Anything else (a TypeError, an AssertionError) is a bug and keeps its traceback.
USAGE_ERRORS = (ValueError, OverflowError)
PATH_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)
RUN_ERRORS = (ArithmeticError, OSError)


def exit_code(err: BaseException) -> int:
    """The ``hpcdl`` command's exit status for an error it reports in one line (see NOTE [ exit codes ])."""
    if isinstance(err, HpcdlError):
        return err.exit_code
    return 2 if isinstance(err, (*USAGE_ERRORS, *PATH_ERRORS)) else 1


def error_line(command: str, err: BaseException) -> str:
    """``hpcdl <command>: error: <message>`` on one line, whatever the exception's message holds."""
    message = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename is not None and str(err.filename) not in message:
        message += f": {err.filename}"
    return f"hpcdl {command}: error: {message}"


#: What the ``hpcdl`` command sets in its environment unless the user did: settings torch's runtime reads once,
#: when torch loads (so they are set before any command imports it, and its subprocesses inherit them).
PROCESS_DEFAULTS = {
    # Idle OpenMP threads sleep instead of spin. torch's intra-op pool and the host codec kernels share one
    # OpenMP runtime, whose idle threads by default busy-wait after every parallel loop, taking cores from
    # whatever else runs (data-loader workers, the job's other ranks, other jobs on a shared node): with one
    # core busy elsewhere, spinning threads cut the sz encoder's speed 2.1x (docs/codecs.md, "Threads on a
    # loaded machine").
    "OMP_WAIT_POLICY": "PASSIVE",
    # CPU tensors of 2 MiB and more on transparent huge pages: a compressed step decodes every saved tensor
    # into fresh memory in backward, and first-touch page faults on 4 KiB pages were most of the sz step's
    # time overhead at DeepCAM's full input (1.17x -> 1.01x with one core busy elsewhere; docs/results/scale).
    "THP_MEM_ALLOC_ENABLE": "1",
}


def set_process_defaults() -> None:
    """Set :data:`PROCESS_DEFAULTS` where the user has not, if torch has not loaded yet (then it is too late:
    setting them would only mislead)."""
    if "torch" not in sys.modules:
        for name, value in PROCESS_DEFAULTS.items():
            os.environ.setdefault(name, value)


def main(argv: list[str] | None = None) -> int:
    set_process_defaults()
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.debug)
    try:
        return int(args.handler(args) or 0)
    except (HpcdlError, *USAGE_ERRORS, *RUN_ERRORS) as err:
        if getattr(args, "debug", False):
            raise
        print(error_line(args.command, err), file=sys.stderr)
        return exit_code(err)


if __name__ == "__main__":
    sys.exit(main())
