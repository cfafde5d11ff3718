"""Stop a run cleanly on SIGUSR1 (a time-limit warning) or SIGTERM (preemption, the time limit itself).

The handler only records the signal; the training loop asks :meth:`StopRequest.agreed` at every step
boundary, which combines every rank's flag in one all-reduce, so all ranks stop after the same step even
when the signal reached them at different steps (or only reached some of them). The loop then writes a
checkpoint and raises :class:`TrainingInterrupted`; ``hpcdl train`` exits with :data:`EXIT_CHECKPOINTED`,
which the Slurm job scripts read as "checkpointed, requeue me" (see docs/slurm.md).
"""

from __future__ import annotations

import atexit
import signal
import threading
from typing import Any

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry". Distinct from 0 (finished),
# 1 (failed) and 2 (bad input), and from 128+N (killed by signal N).
EXIT_CHECKPOINTED = 75
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """A run stopped on a signal after writing a checkpoint; resume it with ``hpcdl train --resume``."""

    def __init__(self, signal_name: str, step: int, checkpoint: str):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        super().__init__(f"stopped on {signal_name} after step {step}; checkpoint {checkpoint} written; "
                         "continue with `hpcdl train CONFIG --resume RUN_DIR`")


# The first stop signal received and not yet acted on: set by _record (the main thread's handler), cleared when
# the ranks agree to stop on it or when a StopRequest installs its own handlers.
_received: int | None = None


def _record(number: int, frame) -> None:
    global _received
    if _received is None:  # the first signal names the stop (a USR1 warning before the TERM)
        _received = number


def hold_stop_signals() -> None:
    """From now until the process exits, record SIGUSR1/SIGTERM instead of dying of them (ignore them once it
    exits: :func:`_ignore_while_exiting`).

    ``hpcdl train`` calls this first, before it loads torch. A rank that a signal reaches outside the training
    loop (while it starts, after it stopped, or a second copy of the warning from mpirun/srun while it shuts
    down) would otherwise die of the default action and fail the job; held, a signal that comes before the
    loop stops the run at its first step boundary and one that comes after it changes nothing.
    """
    if threading.current_thread() is threading.main_thread():
        for number in STOP_SIGNALS:
            signal.signal(number, _record)
        atexit.unregister(_ignore_while_exiting)  # once, however often a process holds them
        atexit.register(_ignore_while_exiting)


def _ignore_while_exiting() -> None:
    """At interpreter exit, turn held stop signals into ignored ones, so they stay harmless to the very end.

    Python's finalization resets every signal that has a Python handler to the default action, which for
    SIGUSR1 and SIGTERM is to die, and only then does mpi4py's MPI_Finalize run; a rank waiting there for the
    other ranks (on a loaded node, seconds) died of a late copy of the warning and failed its finished or
    checkpointed job. An ignored signal is left as it is. Once the process exits, a held signal changes nothing
    anyway, so whether other exit handlers (Horovod's shutdown) run before or after this one does not matter.
    """
    for number in STOP_SIGNALS:
        if signal.getsignal(number) is _record:
            signal.signal(number, signal.SIG_IGN)


class StopRequest:
    """Records SIGUSR1/SIGTERM while active (a context manager) and restores the previous handlers after.

    Where :func:`hold_stop_signals` already holds them (``hpcdl train``), it keeps a signal received before it
    was entered and leaves the handlers in place. Outside the main thread Python cannot install handlers; the
    request then never fires (a run started from a worker thread keeps the default behaviour of the signals).
    """

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}  # what signal.signal returned: a handler, SIG_DFL/SIG_IGN or None
        self._stopped_by: int | None = None  # the signal of the agreed stop on this rank (None: another rank's)

    def __enter__(self) -> StopRequest:
        global _received
        held = all(signal.getsignal(number) is _record for number in STOP_SIGNALS)
        if not held and threading.current_thread() is threading.main_thread():
            _received = None
            for number in STOP_SIGNALS:
                self._previous[number] = signal.signal(number, _record)
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def agreed(self, backend) -> bool:
        """Whether any rank received a stop signal; collective: every rank must call it at the same step.

        A stop agreed on consumes the signal (:attr:`name` keeps it), so that a later run in the same process
        that holds the signals does not stop on it again.
        """
        global _received
        flag = 1.0 if _received is not None else 0.0
        if backend.size > 1:
            flag = backend.allreduce_mean({"stop": flag})["stop"]
        if flag > 0:
            self._stopped_by, _received = _received, None
        return flag > 0

    @property
    def name(self) -> str:
        """The signal the agreed stop was for on this rank, or where it came from."""
        return signal.Signals(self._stopped_by).name if self._stopped_by is not None else "a signal on another rank"
