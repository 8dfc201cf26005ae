"""The cluster environments a process can be started in, tried from one ordered list.

Each environment is a small class: ``detect(request)`` says whether it started this process,
``locate(request)`` reads rank, world and device from it and joins the process group. The
``ProcessState`` is built from what ``locate`` returns (a ``Placement``). ``ENVIRONMENTS`` is
the order, and the order is the precedence:

1. ``XLAEnvironment``: XLA asked for (``x-launch --tpu``, ``distributed_type: XLA``), or an
   ambient ``PJRT_DEVICE`` as torch_xla users set it. First, because a TPU job started by
   torchrun carries torchrun's variables too, yet its ranks and devices belong to the XLA runtime
   (under torchrun the ``xla://`` rendezvous is joined before the runtime is asked anything). An
   ambient ``PJRT_DEVICE`` counts only when nothing else was asked (an explicit non-XLA
   ``X_DISTRIBUTED_TYPE`` wins), ``cpu=True`` (or the launcher's CPU flag) was not given, and
   torch_xla is importable.
2. ``TorchrunEnvironment``: torch's variables (``RANK``/``WORLD_SIZE``: torchrun, ``x-launch``).
   Before SLURM, because ``x-launch`` inside an allocation starts torchrun per node: those
   processes carry SLURM's variables for the task and torch's for the process.
3. ``SlurmEnvironment``: ``srun python train.py`` without a launcher; the rendezvous is the first
   host of the node list and a port derived from the job id.
4. ``SingleEnvironment``: everything else, one process; it joins a group (of one, through an
   in-process store) only when ``x-launch`` started it for FSDP or DeepSpeed (``GroupOptions.sharded``).

torch's and SLURM's variables are read once, by ``x_common.process_env`` (torch's first, as the
order above), whatever environment is chosen, so a malformed variable is always reported.
Every environment joins through the one ``join_group``, which adopts a group another accelerator
(or the script) created. torch_xla is imported by ``XLAEnvironment`` only, when it is chosen.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from x_common import env
from x_common.process_env import ProcessEnv
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.process.topology.elastic_rendezvous import attempt_rendezvous
from x_runtime.process.topology.environment_contract import ClusterEnvironment, GroupOptions, Placement, Request
from x_runtime.process.topology.join_group import join_group
from x_runtime.process.topology.peer_exit import await_peers
from x_runtime.process.topology.xla_environment import XLAEnvironment, import_torch_xla

__all__ = [
    "ENVIRONMENTS",
    "ClusterEnvironment",
    "GroupOptions",
    "Placement",
    "Request",
    "SingleEnvironment",
    "SlurmEnvironment",
    "TorchrunEnvironment",
    "XLAEnvironment",
    "import_torch_xla",
    "join_group",
    "locate",
]


class _TorchEnvironment:
    """Shared by torchrun, SLURM and a single process: device by local rank, a gloo/nccl/xccl group."""

    name = ""

    def detect(self, request: Request) -> bool:
        return request.where.source == self.name

    def launched(self, request: Request) -> bool:
        """Whether a launcher started the process (a sharding strategy then joins even a world of one)."""
        return True

    def rendezvous(self, request: Request) -> str | None:
        return request.group.init_method or attempt_rendezvous(request.environ)

    def in_process(self, request: Request) -> bool:
        return False

    def locate(self, request: Request) -> Placement:
        where = request.where
        device = _pick_device(request.cpu, where.local_rank, request.device)
        launched = self.launched(request)
        joins = where.is_distributed or (request.group.sharded and launched)
        group = request.group
        backend = (group.backend or _default_backend(device, group.cpu_collectives)) if joins else None
        owns = False
        if joins and not dist.is_initialized() and env.NOTEBOOK_WORKER.read(request.environ):
            await_peers(request.environ, where.rank, where.world_size, request.group_timeout())
        if joins:
            owns = join_group(
                backend=backend,
                timeout=request.group_timeout(),
                rank=where.rank,
                world_size=where.world_size,
                init_method=lambda: self.rendezvous(request),
                device=device,
                in_process=self.in_process(request),
            )
            if not owns:
                backend = dist.get_backend()
        return Placement(
            rank=where.rank,
            local_rank=where.local_rank,
            world_size=where.world_size,
            local_world_size=where.local_world_size,
            node_rank=where.node_rank,
            device=device,
            backend=backend,
            distributed_type=_distributed_type(where, device),
            source=where.source,
            owns_process_group=owns,
        )


class TorchrunEnvironment(_TorchEnvironment):
    """torch's variables (torchrun, x-launch): ``env://``, or the agent's store per restart attempt."""

    name = "torchrun"


class SlurmEnvironment(_TorchEnvironment):
    """SLURM's variables only (``srun python train.py``): rendezvous at the first host of the job."""

    name = "slurm"

    def rendezvous(self, request: Request) -> str | None:
        if request.group.init_method is not None:
            return request.group.init_method
        where = request.where
        if where.master_port is None:
            raise ValueError(f"under SLURM without {env.SLURM_JOB_ID.name}, set {env.MASTER_PORT.name}")
        return f"tcp://{where.master_addr}:{where.master_port}"


class SingleEnvironment(_TorchEnvironment):
    """One process started directly (by x-launch, or by hand)."""

    name = "single"

    def detect(self, request: Request) -> bool:
        return True  # the last resort

    def launched(self, request: Request) -> bool:
        # x-launch runs one process without torchrun, so no RANK: its contract flag stands in.
        return bool(env.LAUNCHED_BY_X.read(request.environ))

    def in_process(self, request: Request) -> bool:
        return request.group.init_method is None


# The precedence, first match wins: see the module docstring for why in this order.
ENVIRONMENTS: tuple[ClusterEnvironment, ...] = (
    XLAEnvironment(),
    TorchrunEnvironment(),
    SlurmEnvironment(),
    SingleEnvironment(),
)


def locate(request: Request) -> Placement:
    """Place this process with the first environment of ``ENVIRONMENTS`` that detects it."""
    for environment in ENVIRONMENTS:
        if environment.detect(request):
            return environment.locate(request)
    raise AssertionError("SingleEnvironment detects every process")  # pragma: no cover


def _pick_device(cpu: bool, local_rank: int, named: str | None = None) -> torch.device:
    if named is not None:  # as Accelerate: the variable names the device outright
        try:
            return torch.device(named)
        except RuntimeError:
            names = " or ".join([env.TORCH_DEVICE.name, *(f.name for f in env.TORCH_DEVICE.fallbacks)])
            raise ValueError(
                f"{names} is {named!r}, not a torch device; write one as torch does: cpu, cuda:1, xpu:0"
            ) from None
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


def _default_backend(device: torch.device, cpu_collectives: bool = False) -> str:
    backend = {"cuda": "nccl", "xpu": "xccl"}.get(device.type)
    if backend is None:
        return "gloo"
    # FSDP's CPU-offloaded shards (gradient norms, found-inf checks) and full state dicts gathered to
    # the CPU make collectives on CPU tensors, which NCCL and XCCL refuse: gloo carries those.
    return f"{device.type}:{backend},cpu:gloo" if cpu_collectives else backend


def _distributed_type(where: ProcessEnv, device: torch.device) -> str:
    if not where.is_distributed:
        return DistributedType.NO
    return {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU}.get(
        device.type, DistributedType.MULTI_CPU
    )
