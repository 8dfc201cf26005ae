"""The engine base: what runs a job, and the plan an engine builds for it.

An engine is one way of starting the processes (the interpreter, torchrun's agent, srun, torch_xla's
launcher). ``build_plan`` picks one and asks it for the command (``Engine.plan``); ``run_plan``
asks the plan's engine what running it takes (its agent's output, preemption, the stall watch),
so no caller tells engines apart by name.
"""

from __future__ import annotations

import abc
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from x_launch.config.launch_config import LaunchConfig
from x_launch.engines.slurm import SlurmJob

__all__ = ["Engine", "LaunchPlan", "LaunchRequest"]


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """What a launch asks for, with what ``build_plan`` found out before it chose the engine."""

    settings: LaunchConfig
    target: list[str]  # the script and its arguments, or the module and its arguments
    env_vars: dict[str, str]  # the contract and each process's devices and threads
    environ: Mapping[str, str]
    job: SlurmJob | None = None  # the SLURM allocation x-launch runs in, if any
    module: bool = False
    log_dir: str | None = None
    tee: bool | str = False  # True, or torchrun's streams ("3", "0:1,1:2")
    no_python: bool = False  # the target is an executable, run without the interpreter
    python: str = sys.executable
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def runner(self) -> list[str]:
        """What starts the target itself: the interpreter (with ``-m`` for a module), or nothing."""
        return [] if self.no_python else [self.python, *(["-m"] if self.module else [])]


class Engine(abc.ABC):
    """One way of starting a job's processes: how its command is built, and what it needs while it runs.

    The class attributes are what ``run_plan`` asks; a subclass sets those that differ from a
    plain child process.
    """

    name: ClassVar[str]  # what --dry-run prints after "engine:"
    # torchrun's agent: its stderr is read for workers' lines, it writes a failure report, and the
    # ranks' stderr files are followed to the terminal.
    has_agent: ClassVar[bool] = False
    # False where what the engine starts relays preemption and requeues itself (srun: one x-launch per node).
    relays_preemption: ClassVar[bool] = True
    # False where the stall watchdog is left to what the engine starts (srun's x-launches, torch_xla).
    watches_stalls: ClassVar[bool] = True

    @abc.abstractmethod
    def plan(self, request: LaunchRequest) -> LaunchPlan:
        """The command and environment that run ``request`` with this engine.

        Raises:
            ConfigError: a request this engine cannot run, named with the fix.
        """

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    engine: Engine
    settings: LaunchConfig = field(default_factory=LaunchConfig)
    notes: list[str] = field(default_factory=list)  # how the plan came about, e.g. the SLURM situation
    warnings: list[str] = field(default_factory=list)  # said once, when the job starts
    scratch_logs: str | None = None  # per-rank stderr logs x-launch keeps for a failure report, then removes

    def describe(self) -> str:
        """What --dry-run prints: every value with its source, the command, the environment."""
        lines = ["resolved config:", *self.settings.shown(), *self.notes]
        lines += [f"engine: {self.engine}", f"command: {shlex.join(self.argv)}", "environment:"]
        lines += [f"  {name}={value}" for name, value in sorted(self.env.items())]
        return "\n".join(lines)
