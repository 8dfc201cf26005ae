"""What an accelerator asks of a cluster environment, and what the environment answers.

``Request`` carries the accelerator's arguments and the launcher's variables, read once, with the
``GroupOptions`` the strategy's choice made;
``Placement`` is where an environment put this process, the stuff a ``ProcessState`` is made of;
``ClusterEnvironment`` is the two methods every environment has. The environments themselves are
in ``environments`` (torchrun, SLURM, one process) and ``xla_environment``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch

from x_common import env
from x_common.process_env import ProcessEnv, process_env

__all__ = ["ClusterEnvironment", "GroupOptions", "Placement", "Request"]


@dataclass(frozen=True)
class GroupOptions:
    """How this process joins torch's process group: the code's ``InitProcessGroupKwargs`` and what the
    chosen strategy needs. Built once, by ``strategies.select.decide``; the environments read it."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None
    sharded: bool = False  # FSDP or DeepSpeed runs: join a group even for a world of one a launcher started
    cpu_collectives: bool = False  # FSDP keeps tensors on the CPU: a gloo side beside NCCL/XCCL


@dataclass(frozen=True)
class Request:
    """What the accelerator asked for, with the launcher's variables read once."""

    environ: Mapping[str, str]  # the settings snapshot's (x_runtime.core.settings)
    where: ProcessEnv  # torch's or SLURM's variables (x_common.process_env)
    asked: str | None  # the launcher's distributed_type (XLA is the environment's to answer)
    cpu: bool
    group: GroupOptions = GroupOptions()
    device: str | None = None  # X_TORCH_DEVICE (Accelerate's ACCELERATE_TORCH_DEVICE): the device, as written

    @classmethod
    def read(cls, *, environ: Mapping[str, str], cpu: bool = False, group: GroupOptions | None = None) -> Request:
        where = process_env(environ)
        asked = env.DISTRIBUTED_TYPE.read(environ)
        cpu = cpu or bool(env.USE_CPU.read(environ))
        return cls(environ, where, asked, cpu, group or GroupOptions(), env.TORCH_DEVICE.read(environ))

    def group_timeout(self) -> timedelta:
        return self.group.timeout or timedelta(seconds=env.PROCESS_GROUP_TIMEOUT.read(self.environ))


@dataclass(frozen=True)
class Placement:
    """Where an environment placed this process: what a ``ProcessState`` is made of."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str | None
    distributed_type: str
    source: str
    owns_process_group: bool = False


class ClusterEnvironment(Protocol):
    name: str

    def detect(self, request: Request) -> bool: ...

    def locate(self, request: Request) -> Placement: ...
