"""Where this process runs: rank, world, device, backend, and the process group.

Read from the launcher contract (``x_common.env``) when ``x-launch`` started the process, and
from torchrun's or SLURM's own variables otherwise. A world larger than one is always trained as
one job: several CPU processes get gloo (Accelerate 1.15 trains each rank alone there unless told
``cpu=True``). Each ``Accelerator`` owns one ``ProcessState``; torch's process group is the only
thing shared, and it is created once and reused by a second accelerator in the same process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from x_common import env
from x_common.process_env import ProcessEnv, process_env

__all__ = ["DistributedType", "ProcessState"]


class DistributedType:
    """Names of the strategies, as Accelerate spells them."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_XPU = "MULTI_XPU"
    FSDP = "FSDP"
    DEEPSPEED = "DEEPSPEED"
    XLA = "XLA"


# Sharding strategies need a process group even when the launcher started a single process.
_SHARDED = (DistributedType.FSDP, DistributedType.DEEPSPEED)


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
        cls,
        *,
        cpu: bool = False,
        backend: str | None = None,
        init_method: str | None = None,
        timeout: timedelta | None = None,
        environ: dict[str, str] | None = None,
        sharded: bool = False,
    ) -> ProcessState:
        """Read the environment, pick the device, and join the process group when distributed.

        ``sharded`` (a sharding plugin was given) joins a process group even for a world of
        one started by a launcher, as the launcher's FSDP/DEEPSPEED choice does. XLA (the
        launcher's choice, or ``PJRT_DEVICE`` set as torch_xla users do) takes rank, world and
        device from the XLA runtime instead (``strategies.xla``).

        Raises:
            ValueError: a launcher variable is malformed, or XLA was asked without torch_xla.
        """
        where = process_env(environ)
        asked = env.DISTRIBUTED_TYPE.read(environ)
        cpu = cpu or bool(env.USE_CPU.read(environ))
        # An ambient PJRT_DEVICE picks XLA only when nothing else was asked and torch_xla is there.
        ambient = asked is None and not cpu and env.PJRT_DEVICE.is_set(environ) and _has_torch_xla()
        if asked == DistributedType.XLA or ambient:
            from x_runtime.strategies.xla import xla_process_state

            flag = (
                f"{env.DISTRIBUTED_TYPE.name}=XLA"
                if asked == DistributedType.XLA
                else f"{env.PJRT_DEVICE.name}={env.PJRT_DEVICE.read(environ)}"
            )
            return xla_process_state(
                init_method=init_method,
                timeout=timeout or timedelta(seconds=env.PROCESS_GROUP_TIMEOUT.read(environ)),
                backend=backend,
                cpu=cpu,
                source_flag=flag,
            )
        device = _pick_device(cpu, where.local_rank)
        distributed_type = _distributed_type(where, device)
        # x-launch runs one process without torchrun, so no RANK: its contract flag stands in.
        launched = where.source != "single" or env.LAUNCHED_BY_X.read(environ)
        joins = where.is_distributed or ((sharded or asked in _SHARDED) and launched)
        chosen_backend = backend or _default_backend(device) if joins else None
        state = cls(
            rank=where.rank,
            local_rank=where.local_rank,
            world_size=where.world_size,
            local_world_size=where.local_world_size,
            node_rank=where.node_rank,
            device=device,
            backend=chosen_backend,
            distributed_type=distributed_type,
            source=where.source,
        )
        if joins:
            seconds = env.PROCESS_GROUP_TIMEOUT.read(environ)
            state._join(where, init_method, timeout or timedelta(seconds=seconds))
        return state

    def _adopt_existing_group(self) -> bool:
        """Use the process group another accelerator (or the script) created, if there is one."""
        if not dist.is_initialized():
            return False
        if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
            raise RuntimeError(
                f"a process group already exists with rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"but the environment says rank {self.rank} of {self.world_size}"
            )
        self.backend = dist.get_backend()
        return True

    def _join(self, where: ProcessEnv, init_method: str | None, timeout: timedelta) -> None:
        if self._adopt_existing_group():
            return
        if init_method is None and where.source == "slurm":
            if where.master_port is None:
                raise ValueError(f"under SLURM without {env.SLURM_JOB_ID.name}, set {env.MASTER_PORT.name}")
            init_method = f"tcp://{where.master_addr}:{where.master_port}"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if init_method is None and where.source == "single":
            # A world of one needs no rendezvous: an in-process store, no port to find.
            dist.init_process_group(backend=self.backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
            self.owns_process_group = True
            return
        dist.init_process_group(
            backend=self.backend,
            init_method=init_method,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )
        self.owns_process_group = True

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
            from x_runtime.collectives import barrier

            barrier()

    def destroy(self) -> None:
        """Leave the process group if this state created it."""
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_process_group = False


def _pick_device(cpu: bool, local_rank: int) -> torch.device:
    if cpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return torch.device("xpu", local_rank % xpu.device_count())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available() and local_rank == 0:
        return torch.device("mps")
    return torch.device("cpu")


def _default_backend(device: torch.device) -> str:
    return {"cuda": "nccl", "xpu": "xccl"}.get(device.type, "gloo")


def _distributed_type(where: ProcessEnv, device: torch.device) -> str:
    if not where.is_distributed:
        return DistributedType.NO
    return {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU}.get(
        device.type, DistributedType.MULTI_CPU
    )


def _has_torch_xla() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None
