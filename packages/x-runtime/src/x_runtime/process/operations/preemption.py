"""The job was asked to stop, agreed by every rank at one step (``Accelerator.preemption_requested``).

x-launch, when it gets a preemption signal (``--preemption_signals``, SLURM's
``--signal=USR1@N`` or ``scancel --signal=USR1``), creates the marker file named by
``X_PREEMPTION_FILE`` instead of passing the signal on; it also starts the workers with those
signals ignored, so one that reaches a worker directly (SLURM signals every process of a step)
does not kill it. Here, the worker installs a handler for the same signals that only sets a
local flag, and each access of ``preemption_requested`` looks at the flag and the marker.

Agreement without a wait: a non-blocking all-reduce (MAX) of this rank's local flag on a gloo
group of its own is started at an access and read at a later one, finished long since. Posting
it costs about 0.1-0.2 ms on gloo, a few percent of a small step, so it is not posted at every
access: the first ``_CALIBRATE`` accesses post one each (a request right at the start is seen at
once), then one blocking all-reduce agrees on the slowest rank's time per access, and from there
on one is posted every ``interval`` accesses, ``interval`` chosen so that happens about every
``_PERIOD_S`` seconds. Every rank counts the same accesses and derives the same interval, so all
answer True at the same access, at most about ``_PERIOD_S`` plus a step after the first rank saw
the request: far inside the minutes SLURM's ``--signal=USR1@N`` grants. An access in between is a
counter increment. Once True, it stays True and no more collectives are started. Like any
collective, every rank must read the property equally often (once per step in the documented
loop). With one process there is no collective at all.

Examples:
    >>> watch = PreemptionWatch(world_size=1, marker=None, signals=())
    >>> watch.requested()
    False
    >>> watch.request()
    >>> watch.requested()
    True
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from x_common import env
from x_runtime.core.settings import current_settings

__all__ = ["PreemptionWatch", "signal_numbers"]

_CALIBRATE = 8  # accesses that each post an all-reduce before the interval is agreed
_PERIOD_S = 0.25  # aimed time between two all-reduces once it is
_MAX_INTERVAL = 100_000


def signal_numbers(names: str | None) -> tuple[int, ...]:
    """``"USR1,TERM"`` (as x-launch writes ``X_PREEMPTION_SIGNALS``; unset: USR1) as signal numbers.

    Examples:
        >>> [signal.Signals(n).name for n in signal_numbers("USR1,SIGTERM")]
        ['SIGUSR1', 'SIGTERM']
    """
    numbers = []
    for name in (names or "USR1").split(","):  # unset: x-launch's default
        name = name.strip().upper()
        if name:
            numbers.append(int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}")))
    return tuple(numbers)


class PreemptionWatch:
    """This rank's preemption flag and the ranks' agreement on it (see the module docstring)."""

    def __init__(self, *, world_size: int, marker: str | None, signals: tuple[int, ...]) -> None:
        self.world_size = world_size
        self.marker = marker
        self._local = False
        self._agreed = False
        self._group: Any = None
        self._flag: torch.Tensor | None = None
        self._work: Any = None
        self._accesses = 0
        self._due = 0  # the access at which the posted all-reduce is read
        self._interval = 1
        self._first_access = 0.0
        for number in signals:
            self._install(number)

    @classmethod
    def from_environment(cls, world_size: int, environ: Mapping[str, str] | None = None) -> PreemptionWatch:
        """The watch for a process started by x-launch (marker and signals from the contract).

        Without the launcher's marker (plain torchrun, srun python) no handler is installed:
        the signals keep their default meaning.
        """
        environ = current_settings().environ if environ is None else environ
        marker = env.PREEMPTION_FILE.read(environ)
        signals = signal_numbers(env.PREEMPTION_SIGNALS.read(environ)) if marker is not None else ()
        return cls(world_size=world_size, marker=marker, signals=signals)

    def _install(self, number: int) -> None:
        # Only the main thread may install handlers; a user's own handler is left alone.
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(number) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            return
        signal.signal(number, self._on_signal)

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self._local = True  # only the flag: the step in progress finishes, then the loop saves

    def request(self) -> None:
        """Mark this rank as asked to stop (what the signal handler and the marker do)."""
        self._local = True

    def local(self) -> bool:
        """Whether this rank was asked to stop: a signal, or the launcher's marker file."""
        if not self._local and self.marker is not None and os.path.exists(self.marker):
            self._local = True
        return self._local

    def requested(self) -> bool:
        """The agreed answer: the same on every rank at the same access."""
        if self._agreed:
            return True
        if self._agree():
            self._acknowledge()
            return True
        return False

    def _acknowledge(self) -> None:
        # Tells x-launch the ranks stopped for the request (it requeues only then, not for a
        # signal that came after the training loop's last check).
        if self.marker is None:
            return
        try:
            os.makedirs(os.path.dirname(self.marker) or ".", exist_ok=True)
            with open(self.marker + env.PREEMPTION_SEEN, "a"):
                pass
        except OSError:
            pass  # the launcher's folder is gone: it no longer waits for the answer

    def _agree(self) -> bool:
        if self.world_size == 1 or not dist.is_initialized():
            self._agreed = self.local()
            return self._agreed
        if self._group is None:
            # A gloo group of its own: the tiny all-reduce never queues behind the gradients.
            self._group = dist.new_group(backend="gloo")
            self._flag = torch.zeros(1, dtype=torch.uint8)
        assert self._flag is not None
        self._accesses += 1
        if self._work is not None:
            if self._accesses < self._due:
                return False
            self._work.wait()  # finished: it was started at least one access (one step) ago
            self._agreed = bool(self._flag.item())
            self._work = None
            if self._agreed:
                return True
        if self._accesses == 1:
            self._first_access = time.monotonic()
        elif self._accesses == _CALIBRATE:
            self._interval = self._agreed_interval()
        self._flag.fill_(1 if self.local() else 0)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._due = self._accesses + self._interval
        return False

    def _agreed_interval(self) -> int:
        """Accesses between two all-reduces: the same on every rank (one blocking all-reduce, once)."""
        per_access_us = (time.monotonic() - self._first_access) / (_CALIBRATE - 1) * 1e6
        slowest = torch.tensor([max(1, int(per_access_us))], dtype=torch.int64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self._group)
        return max(1, min(_MAX_INTERVAL, math.floor(_PERIOD_S * 1e6 / int(slowest.item()))))
