"""Training progress for a person watching: a tqdm bar on a terminal, plain log lines everywhere else.

A Slurm ``.out`` file (or any pipe) is not a terminal; a bar there would fill it with carriage returns, so
instead about :data:`PLAIN_LINES` lines are logged over the run (through ``logging.getLogger("hpcdl")``,
which the CLI sends to stderr).
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)
PLAIN_LINES = 20


class Progress:
    """``update(step, epoch, loss)`` after each step, ``close()`` at the end; silent when not ``enabled``."""

    def __init__(self, name: str, total_steps: int, first_step: int, enabled: bool, stream=None):
        self.name, self.total = name, total_steps
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._bar = None
        self.every = max(1, total_steps // PLAIN_LINES)
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=first_step, desc=name, unit="step", file=self.stream,
                             dynamic_ncols=True)

    def update(self, step: int, epoch: int, loss: float) -> None:
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", epoch=epoch)
        elif self.enabled and (step % self.every == 0 or step == self.total):
            logger.info("%s: step %d/%d epoch %d loss %.4f", self.name, step, self.total, epoch, loss)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
