"""One error hierarchy, and how the ``hpcdl`` command reports it (hpcdl/errors.py, NOTE [ exit codes ] in hpcdl/cli).

Every exception class hpcdl defines is an :class:`hpcdl.errors.HpcdlError` (the few that are not errors are
listed with their reason), and ``hpcdl.errors``' docstring names each one. The command turns an error of the
user's input or of a failed run into one line and an exit status; a programming error keeps its traceback.
"""

from __future__ import annotations

import argparse
import ast
import errno
import importlib
import sys
import types
from pathlib import Path

import pytest

import hpcdl.cli
import hpcdl.errors
from hpcdl.cli import main
from hpcdl.errors import HpcdlError, HpcdlRunError
from hpcdl.models.registry import ModelOptionError
from hpcdl.runtime.session import VerificationError
from hpcdl.train.config import ConfigError

PACKAGE = Path(hpcdl.errors.__file__).resolve().parent
# Exceptions that are not errors: each is raised to end something on purpose and handled by its own code.
NOT_ERRORS = {
    "hpcdl.train.signals.TrainingInterrupted": "a run stopped on SIGTERM/SIGUSR1 after a checkpoint; "
                                               "`hpcdl train` exits 75 (requeue me), not 1 or 2",
}
# Modules that are not imported to find classes: running them has an effect other than defining names.
NOT_IMPORTED = {
    "hpcdl.__main__": "runs the command",
    "hpcdl.study.methods": "a deprecated alias that warns on import and defines nothing",
}


def _defined_exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined (not imported) in a module of hpcdl, by its dotted name."""
    classes = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module_name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names = [node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)]
        if not names or module_name in NOT_IMPORTED:
            continue
        module = importlib.import_module(module_name)
        for name in names:
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                classes[f"{module_name}.{name}"] = cls
    return classes


@pytest.fixture(scope="module")
def exception_classes() -> dict[str, type[BaseException]]:
    return _defined_exception_classes()


def test_every_error_hpcdl_defines_is_an_hpcdl_error(exception_classes):
    errors = {name: cls for name, cls in exception_classes.items() if not issubclass(cls, Warning)}
    assert "hpcdl.data.errors.NonFiniteError" in errors and "hpcdl.models.registry.ModelOptionError" in errors
    strays = sorted(name for name, cls in errors.items() if not issubclass(cls, HpcdlError) and name not in NOT_ERRORS)
    assert not strays, f"derive these from hpcdl.errors.HpcdlError (keeping their builtin base): {strays}"
    gone = sorted(set(NOT_ERRORS) - set(errors))
    assert not gone, f"NOT_ERRORS names classes that no longer exist: {gone}"


def test_the_errors_docstring_names_every_hpcdl_error(exception_classes):
    named = {name.rsplit(".", 1)[1] for name, cls in exception_classes.items()
             if issubclass(cls, HpcdlError) and cls not in (HpcdlError, HpcdlRunError)}
    missing = sorted(name for name in named if f"``{name}``" not in hpcdl.errors.__doc__)
    assert not missing, f"add these to the list in hpcdl/errors.py's docstring: {missing}"


def _command(monkeypatch, raised: BaseException) -> None:
    """Make ``hpcdl failing`` a command whose handler raises ``raised`` (the only command, to parse fast)."""
    def register(subparsers: argparse._SubParsersAction) -> None:
        parser = subparsers.add_parser("failing")

        def handler(args):
            raise raised
        parser.set_defaults(handler=handler)

    module = types.ModuleType("hpcdl.cli.failing")
    module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hpcdl.cli.failing", module)
    monkeypatch.setattr(hpcdl.cli, "COMMAND_MODULES", ("failing",))


@pytest.mark.parametrize("raised, status", [
    (ConfigError("train.batch must be at least 1,\n  got 0"), 2),  # the user's input
    (ModelOptionError("ResNet takes no option 'colour'"), 2),  # a TypeError, still the user's
    (VerificationError("decoded tensor differs"), 1),  # a run that started and failed
    (ValueError("a check not yet given its own class"), 2),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/no/such/file"), 2),  # a path the user named
    (PermissionError(errno.EACCES, "Permission denied", "/root/out"), 2),
    (OSError(errno.ENOSPC, "No space left on device"), 1),  # the machine failing a run that started
    (TimeoutError("Slurm job 7 did not finish within 60 s"), 1),
    (FloatingPointError("training loss became nan at step 3"), 1),
])
def test_an_error_becomes_one_line_and_its_exit_status(monkeypatch, capsys, raised, status):
    _command(monkeypatch, raised)
    assert main(["failing"]) == status
    err = capsys.readouterr().err
    assert err.startswith("hpcdl failing: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert " ".join(str(raised).split()) in err


def test_a_programming_error_keeps_its_traceback(monkeypatch, capsys):
    _command(monkeypatch, TypeError("unsupported operand type(s) for +: 'int' and 'str'"))
    with pytest.raises(TypeError, match="unsupported operand"):
        main(["failing"])
    assert "error:" not in capsys.readouterr().err


def test_debug_shows_the_traceback_of_an_error_it_would_report(monkeypatch):
    _command(monkeypatch, ConfigError("bad value"))
    with pytest.raises(ConfigError, match="bad value"):
        main(["failing", "--debug"])


def test_a_command_module_that_fails_to_import_is_an_error_not_a_missing_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "hpcdl.cli.train", None)  # `import hpcdl.cli.train` now raises ImportError
    with pytest.raises(ImportError, match=r"hpcdl\.cli\.train"):
        main(["--help"])


def test_a_run_that_fails_after_it_started_exits_1(tmp_path, capsys, one_thread):
    tiny = ["data.dataset=synthetic", "data.synthetic_samples=32", "model.scale=tiny", "train.batch=8",
            "train.steps_per_epoch=2", "train.epochs=1", "train.val_steps=1", "logging.progress=false",
            f"logging.out_dir={tmp_path}", "optimizer.lr=1e30"]  # a valid config whose loss becomes NaN
    assert main(["train", "hep-particles", *(arg for item in tiny for arg in ("--set", item))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hpcdl train: error: training loss became nan") and "Traceback" not in "\n".join(err)
