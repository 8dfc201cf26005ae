"""Preemption and requeue: the launcher's half of ``Accelerator.preemption_requested``.

A preemption signal (``--preemption_signals``, default USR1: SLURM's ``--signal=USR1@N`` and
``scancel --signal=USR1``) must not kill anything: SIGUSR1's default action ends a process, and
torchrun's agent would stop the workers on SIGTERM before they could save. So x-launch starts
the engine with those signals ignored (an ignored signal stays ignored across exec, in the
agent and in the workers it starts), tells torchrun's agent not to handle them
(torchrun's ``--signals-to-handle``, as ``PET_SIGNALS_TO_HANDLE``), and when it gets one itself it creates a marker file
whose path every worker gets in ``X_PREEMPTION_FILE``. The runtime reads the marker (and its own
handler's flag, for a signal that reached the worker directly) at step boundaries.

With ``--requeue`` inside a SLURM job, once the ranks have exited after stopping for a
preemption (the runtime creates ``<marker>.seen`` when ``preemption_requested`` turns True; a
signal that comes after the loop's last check finds the job done and requeues nothing), the
x-launch of SLURM task 0 runs ``scontrol requeue $SLURM_JOB_ID``: the job goes back to the
queue and its script starts again, where ``load_state()`` resumes from the latest checkpoint.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType

from x_common import env
from x_launch.config.file import ConfigError

__all__ = ["ALLOWED", "DEFAULT", "PreemptionRelay", "parse_signals", "requeue_job"]

# INT stays the way to stop a launch; KILL and STOP cannot be caught.
ALLOWED = ("USR1", "USR2", "TERM", "HUP")
DEFAULT = "USR1"  # what SLURM's --signal sends unless told otherwise
_AGENT_DEFAULT = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's own default


def parse_signals(text: str | None) -> tuple[signal.Signals, ...]:
    """``"USR1,TERM"`` (``SIG`` prefix optional, any case) as signals.

    Examples:
        >>> [s.name for s in parse_signals("usr1, SIGTERM")]
        ['SIGUSR1', 'SIGTERM']

    Raises:
        ConfigError: a name that is not one of ``ALLOWED``.
    """
    found: list[signal.Signals] = []
    for raw in (text or DEFAULT).split(","):
        name = raw.strip().upper().removeprefix("SIG")
        if not name:
            continue
        if name not in ALLOWED:
            raise ConfigError(
                f"preemption_signals: {raw.strip()!r} cannot be a preemption signal; "
                f"use some of {', '.join(ALLOWED)} (e.g. --preemption_signals USR1,TERM)"
            )
        found.append(signal.Signals[f"SIG{name}"])
    return tuple(dict.fromkeys(found))


@dataclass
class PreemptionRelay:
    """The marker file and the signal handling of one launch."""

    signals: tuple[signal.Signals, ...]
    folder: str = field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), f"x-launch-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    )
    requested: bool = False

    @property
    def marker(self) -> str:
        return os.path.join(self.folder, "preempted")

    def environment(self) -> dict[str, str]:
        """What the engine and the workers get: the marker's path, torchrun's signals less ours."""
        ours = {s.name for s in self.signals}
        agent = ",".join(name for name in _AGENT_DEFAULT if name not in ours)
        return env.to_environ({env.PREEMPTION_FILE: self.marker, env.TORCHRUN_SIGNALS: agent})

    def death_signal(self) -> int:
        """What the engine gets if x-launch dies outright: one it still stops on."""
        return signal.SIGINT if signal.SIGTERM in self.signals else signal.SIGTERM

    def ignore_in_child(self) -> None:
        """In the engine's process before exec: the preemption signals ignored from then on."""
        for number in self.signals:
            signal.signal(number, signal.SIG_IGN)

    def on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        """x-launch's handler: create the marker, once; the workers see it at their next step."""
        if self.requested:
            return
        self.requested = True
        os.makedirs(self.folder, exist_ok=True)
        with open(self.marker, "w") as handle:
            handle.write(f"{_signum}\n")

    def acknowledged(self) -> bool:
        """Whether a rank stopped for the request (the runtime creates ``<marker>.seen`` then)."""
        return os.path.exists(self.marker + env.PREEMPTION_SEEN)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def requeue_job(environ: Mapping[str, str]) -> tuple[int, str]:
    """``scontrol requeue`` this job from SLURM task 0 only; the exit code and the line to print."""
    job_id = env.SLURM_JOB_ID.read(environ)
    if (env.SLURM_PROCID.read(environ) or 0) != 0:
        return 0, f"x-launch: preempted; SLURM task 0 requeues job {job_id}"
    try:
        out = subprocess.run(
            ["scontrol", "requeue", str(job_id)], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, f"x-launch: preempted, but scontrol requeue {job_id} could not run: {exc}"
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        return 1, f"x-launch: preempted, but scontrol requeue {job_id} failed: {why}"
    return 0, f"x-launch: preempted; the ranks exited; requeued SLURM job {job_id}"
