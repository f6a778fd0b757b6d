"""How a command stops on Ctrl-C (SIGINT) or SIGTERM: the exceptions it raises and the handler
that turns SIGTERM into one. Only the standard library: the commands that do not train
(``generate``, ``eval``, ``classify``) use these without importing Lightning."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Terminated", "TrainingInterrupted", "sigterm_raises", "stopped_by"]


def stopped_by(signum: int) -> str:
    """How a run stopped by ``signum`` is said: "interrupted" (Ctrl-C), "stopped by SIGTERM"."""
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, ``docker stop``, a scheduler's preemption) met outside
    training, raised by the handler :func:`sigterm_raises` installs: the program stops as on
    Ctrl-C, removing what it was writing. A ``KeyboardInterrupt``, with ``signum``."""

    signum = signal.SIGTERM


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by Ctrl-C (SIGINT) or SIGTERM: at which step, and the checkpoint
    to resume from.

    A ``KeyboardInterrupt``, so code that stops on Ctrl-C still does; ``signum`` says which
    signal (``exit_status`` is the shell's status for it: 130, 143). ``checkpoint`` is the
    last one written (on SIGTERM, that of the step reached), or the one the run resumed
    from, ``None`` when there is none yet; ``checkpoint_step`` is the step it holds.
    """

    def __init__(
        self, step: int, checkpoint: str | None, checkpoint_step: int | None, run_dir: str, *, finished: bool = False,
        signum: int = signal.SIGINT, max_steps: int | None = None,
    ) -> None:
        self.step, self.checkpoint, self.checkpoint_step, self.run_dir = step, checkpoint, checkpoint_step, run_dir
        self.max_steps = max_steps  # the run's last step (training.max_steps, or the steps its max_epochs make)
        self.finished = finished  # every step ran: only the closing validation was cut off
        self.signum = int(signum)
        where = f"; the last checkpoint (step {checkpoint_step}) is {checkpoint}" if checkpoint else "; no checkpoint yet"
        when = f"in the closing validation, after the last step ({step})" if finished else f"at step {step}"
        super().__init__(f"{stopped_by(self.signum)} {when}{where}")

    @property
    def exit_status(self) -> int:
        """128 + the signal: what a shell reports for a program the signal stopped."""
        return 128 + self.signum


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` wherever the program is, as
    Ctrl-C raises ``KeyboardInterrupt``: a command stops with a message, and a file being
    written is removed, instead of the process dying silently. Inside a Lightning run
    Lightning's own handler is in charge (it ends training at the end of a batch, and
    :func:`train` saves that step); it calls the handler it found, which then does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if signal.getsignal(signal.SIGTERM) is handler:  # not called from Lightning's handler
            raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
