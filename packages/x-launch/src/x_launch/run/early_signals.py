"""Preemption signals that reach x-launch before its launch is ready to relay them.

SLURM's ``--signal=USR1@N`` can land a few seconds into a job; on a loaded node that can be while
x-launch is still reading its config, where USR1's default action would end it (srun: "task 0:
User defined signal 1") and the job would neither train nor requeue. So a launch catches USR1 and
USR2 from the first line of ``main`` and hands what came to ``run_plan``, which acts on each once
it knows the configured preemption signals. TERM, HUP and INT keep their default until then: they
are how users and schedulers stop a launch that has not started anything yet.

Only this module's own imports run before the handler is in place: keep it free of x's imports.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from types import FrameType

__all__ = ["EARLY", "EarlySignals"]

EARLY = (signal.SIGUSR1, signal.SIGUSR2)  # default action: end the process; nobody means "stop" by them


@dataclass
class EarlySignals:
    """The early signals caught so far, in arrival order, each once."""

    caught: list[signal.Signals] = field(default_factory=list)

    @classmethod
    def catch(cls) -> EarlySignals:
        """Start catching ``EARLY`` in this process (the main thread: signal handlers live there)."""
        early = cls()
        for number in EARLY:
            signal.signal(number, early._record)
        return early

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        number = signal.Signals(signum)
        if number not in self.caught:
            self.caught.append(number)

    def unwanted(self, preemption: tuple[signal.Signals, ...]) -> signal.Signals | None:
        """The first caught signal that is not a preemption signal of this launch, if any."""
        return next((number for number in self.caught if number not in preemption), None)

    @staticmethod
    def die_of(number: signal.Signals) -> None:
        """End this process as ``number``'s default action would have, when it came."""
        signal.signal(number, signal.SIG_DFL)
        signal.raise_signal(number)
