"""Measuring a step's peak: here on CUDA, in a fresh, allocator-tuned Python process on the CPU.

The child process starts with :func:`hpcdl.memory.allocator.child_env`, reads pickled setups
(e.g. :class:`hpcdl.memory.step.TrainStep`) from its stdin, measures each with
:func:`hpcdl.memory.peak.measure_step` (one warm-up step, then the measured one) and writes the
pickled :class:`~hpcdl.memory.peak.PeakReport` back, after a progress frame for every line its steps log
(:func:`hpcdl.memory.step.step_progress`). An error in a measurement comes back as the same exception, raised
here with the child's traceback as a note. A child whose parent is gone (killed) stops within
:data:`ORPHAN_CHECK_S` instead of finishing a measurement nobody reads, which at DeepCAM's full input takes
an hour and both cores.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

import torch

from hpcdl.errors import HpcdlRunError
from hpcdl.memory.allocator import child_env
from hpcdl.memory.peak import PeakReport, measure_step
from hpcdl.memory.step import TrainStep, step_progress

#: How often a measuring process checks that the process that started it is still there.
ORPHAN_CHECK_S = 1.0


class MeasuringProcessError(HpcdlRunError, RuntimeError):
    """The measuring process ended before it replied: killed (the kernel's out-of-memory killer, at a batch too
    large for the machine), or crashed; its own stderr, above, says more."""


def _death(code: int) -> str:
    """How a child that exited with ``code`` ended, in words."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if -code == signal.SIGKILL:
        name += " (often the kernel's out-of-memory killer: a batch too large for this machine's memory)"
    return f"was killed by {name}"


class MeasuringProcess:
    """A fresh Python process that measures the steps sent to it (pickles over its stdin and stdout).

    Each measurement builds its own state and resets the high-water mark, so one process can serve many; pass it
    as ``process=`` to :func:`peak` and :func:`hpcdl.memory.search_batch` to pay for starting Python and torch once.
    ``progress`` gets each line the measured steps log as they run (e.g. ``warm-up step 3 of 9: 212.4 s``).
    """

    def __init__(self, threads: int | None = None, progress: Callable[[str], None] | None = None):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"a measuring process runs a whole number of torch threads >= 1 (or None: this "
                             f"process's count), got {threads!r}")
        self.progress = progress
        env = {**os.environ, **child_env(), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        threads = threads or torch.get_num_threads()
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"import hpcdl.memory.process as m; m.serve({int(threads)}, {os.getpid()})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None  # both are PIPEs
        self.requests, self.replies = self.process.stdin, self.process.stdout

    def peak(self, setup: Callable) -> PeakReport:
        payload = pickle.dumps(setup)
        try:
            self.requests.write(struct.pack("<Q", len(payload)) + payload)
            self.requests.flush()
            status, value = pickle.loads(_read_frame(self.replies))
            while status == "progress":
                if self.progress is not None:
                    self.progress(value)
                status, value = pickle.loads(_read_frame(self.replies))
        except (BrokenPipeError, EOFError):
            raise MeasuringProcessError(f"the measuring process {_death(self.process.wait())} before it replied; "
                                        "see its stderr above") from None
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        self.requests.close()
        self.process.wait()
        self.replies.close()  # else a ResourceWarning at garbage collection (an error under pytest)

    def __enter__(self) -> MeasuringProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FreshProcesses:
    """Measures every setup in a new :class:`MeasuringProcess`, closed after it: a probe inherits nothing
    (heap pages, caches) from the one before, at the price of starting Python and torch each time.

    Pass it as ``process=`` wherever a :class:`MeasuringProcess` is taken; ``progress`` as there.
    """

    def __init__(self, threads: int | None = None, progress: Callable[[str], None] | None = None):
        self.threads = threads
        self.progress = progress

    def peak(self, setup: Callable) -> PeakReport:
        with MeasuringProcess(self.threads, self.progress) as fresh:
            return fresh.peak(setup)

    def close(self) -> None:
        """Nothing stays open between measurements."""


def _read_frame(stream) -> bytes:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    (size,) = struct.unpack("<Q", head)
    body = stream.read(size)
    if len(body) < size:
        raise EOFError
    return body


def serve(threads: int, parent: int) -> None:
    """The child's loop: read a setup, measure it (sending its steps' progress lines), write the report; until
    stdin closes, or until the process ``parent`` that started it is gone (:func:`_stop_when_orphaned`)."""
    threading.Thread(target=_stop_when_orphaned, args=(parent,), name="orphan-check", daemon=True).start()
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the model prints goes to stderr, not into the reply stream
    torch.set_num_threads(threads)

    def send(reply: tuple[str, object]) -> None:
        payload = pickle.dumps(reply)
        replies.write(struct.pack("<Q", len(payload)) + payload)
        replies.flush()

    with step_progress(lambda line: send(("progress", line))):
        while True:
            try:
                setup = pickle.loads(_read_frame(sys.stdin.buffer))
            except EOFError:
                return
            try:
                send(("ok", measure_step(setup, torch.device("cpu"))))
            except Exception as err:
                send(("error", _portable(err, traceback.format_exc())))


def _stop_when_orphaned(parent: int) -> None:
    """Exit once this process's parent is no longer ``parent`` (it died and the process was re-parented): its
    stdin only closes when the measurement under way ends and reads the next request."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    print(f"hpcdl measuring process {os.getpid()}: the process that started it ({parent}) is gone; stopping",
          file=sys.stderr, flush=True)
    os._exit(1)


def _portable(err: Exception, trace: str) -> Exception:
    """``err`` as the parent will raise it: the same class and message (an ``HpcdlError`` stays one line at the
    command, with its exit code), with the child's traceback as a note; a ``RuntimeError`` naming the class
    where the exception does not survive pickling."""
    note = f"raised in the measuring process:\n{trace}"
    try:
        copy = pickle.loads(pickle.dumps(err))
        if type(copy) is not type(err):
            raise TypeError("not the same class after pickling")
    except Exception:
        copy = RuntimeError(f"{type(err).__name__}: {err}")
    copy.add_note(note)
    return copy


def _device_of(setup) -> torch.device:
    return torch.device(setup.device if isinstance(setup, TrainStep) else "cpu")


def peak(
    setup: Callable, *, device: str | None = None, threads: int | None = None,
    process: MeasuringProcess | FreshProcesses | None = None,
) -> PeakReport:
    """The true peak memory of one training step, above what existed before it.

    ``setup`` is a picklable zero-argument callable that builds the state
    (model, data, optimizer) and returns the step function, e.g. a
    :class:`TrainStep`. The step runs once to warm up, then once measured. On
    CUDA it runs here; on the CPU in a fresh process, or in ``process`` if
    given (module-level callables only; their module must be importable there).
    """
    if not callable(setup):
        raise TypeError(f"peak takes a setup callable (e.g. hpcdl.memory.TrainStep) that returns the step, got {setup!r}")
    target = torch.device(device) if device else _device_of(setup)
    if target.type == "cuda":
        return measure_step(setup, target)
    if target.type != "cpu":
        raise ValueError(f"peak measures on 'cpu' or 'cuda', got {target}")
    if process is not None:
        return process.peak(setup)
    with MeasuringProcess(threads) as fresh:
        return fresh.peak(setup)
