"""Where this process runs: rank, world, device, backend, and the process group.

Read from the launcher contract (``x_common.env``) when ``x-launch`` started the process, and
from torchrun's or SLURM's own variables otherwise (``environments`` holds the cluster
environments and their order). A world larger than one is always trained as one job: several CPU
processes get gloo (Accelerate 1.15 trains each rank alone there unless told ``cpu=True``). Each
``Accelerator`` owns one ``ProcessState``; torch's process group is the only thing shared, and it
is created once and reused by a second accelerator in the same process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist

from x_common import env
from x_runtime.core.settings import current_settings
from x_runtime.process.collectives import barrier
from x_runtime.process.collectives.debug import set_debug_default
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.process.topology.environments import GroupOptions, Request, locate

__all__ = ["DistributedType", "ProcessState"]


@dataclass
class ProcessState:
    """This process's place in the job and the device it computes on."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str | None
    distributed_type: str
    source: str
    owns_process_group: bool = field(default=False, repr=False)

    @classmethod
    def from_environment(
        cls, *, cpu: bool = False, group: GroupOptions | None = None, environ: Mapping[str, str] | None = None
    ) -> ProcessState:
        """Read the environment, pick the device, and join the process group when distributed.

        ``group`` (``strategies.select.decide`` makes it) says how: the code's backend,
        rendezvous and timeout; ``sharded`` joins a process group even for a world of one started
        by a launcher, as FSDP and DeepSpeed need; ``cpu_collectives`` (FSDP with CPU offload or
        full state dicts) makes the default GPU backend carry CPU tensors too
        (``"cuda:nccl,cpu:gloo"``). XLA (the launcher's choice, or ``PJRT_DEVICE`` set as
        torch_xla users do) takes rank, world and device from the XLA runtime instead
        (``xla_environment.XLAEnvironment``).

        Raises:
            ValueError: a launcher variable is malformed, or XLA was asked without torch_xla.
        """
        environ = current_settings().environ if environ is None else environ
        placement = locate(Request.read(cpu=cpu, group=group, environ=environ))
        set_debug_default(bool(env.DEBUG_MODE.read(environ)))  # for the collectives over the group joined
        return cls(**{f.name: getattr(placement, f.name) for f in fields(placement)})

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self.rank == self.world_size - 1

    @property
    def use_distributed(self) -> bool:
        return self.world_size > 1

    def wait_for_everyone(self) -> None:
        if self.use_distributed and dist.is_initialized():
            barrier()

    def destroy(self) -> None:
        """Leave the process group if this state created it."""
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_process_group = False
