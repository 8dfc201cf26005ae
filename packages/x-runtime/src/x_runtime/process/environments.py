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
   in-process store) only when ``x-launch`` asked for FSDP or DeepSpeed.

torch's and SLURM's variables are read once, by ``x_common.process_env`` (torch's first, as the
order above), whatever environment is chosen, so a malformed variable is always reported.
Every environment joins through the one ``join_group``, which adopts a group another accelerator
(or the script) created. torch_xla is imported by ``XLAEnvironment`` only, when it is chosen.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from x_common import env
from x_common.process_env import ProcessEnv, process_env
from x_runtime.process.distributed_type import SHARDED, DistributedType
from x_runtime.process.elastic_rendezvous import attempt_rendezvous
from x_runtime.process.peer_exit import await_peers

__all__ = [
    "ENVIRONMENTS",
    "ClusterEnvironment",
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

INSTALL_HINT = (
    "pip install 'x-runtime[tpu]' on a TPU VM, or pip install torch_xla==<your torch version> "
    "(torch_xla is released for one torch version at a time)"
)


@dataclass(frozen=True)
class Request:
    """What the accelerator asked for, with the launcher's variables read once."""

    environ: Mapping[str, str] | None
    where: ProcessEnv  # torch's or SLURM's variables (x_common.process_env)
    asked: str | None  # the launcher's distributed_type
    cpu: bool
    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None
    sharded: bool = False  # a sharding plugin was given in code

    @classmethod
    def read(
        cls,
        *,
        cpu: bool = False,
        backend: str | None = None,
        init_method: str | None = None,
        timeout: timedelta | None = None,
        environ: Mapping[str, str] | None = None,
        sharded: bool = False,
    ) -> Request:
        where = process_env(environ)
        asked = env.DISTRIBUTED_TYPE.read(environ)
        cpu = cpu or bool(env.USE_CPU.read(environ))
        return cls(environ, where, asked, cpu, backend, init_method, timeout, sharded)

    def group_timeout(self) -> timedelta:
        return self.timeout or timedelta(seconds=env.PROCESS_GROUP_TIMEOUT.read(self.environ))


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


def join_group(
    *,
    backend: str | None,
    timeout: timedelta,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | Callable[[], str | None] | None = None,
    device: torch.device | None = None,
    in_process: bool = False,
    assign_ranks: bool = True,
) -> bool:
    """Join torch's default process group, or adopt the one that exists; True when this call created it.

    Args:
        backend: the group's backend.
        timeout: bounds every collective of the group.
        rank: this process's rank; an existing group must agree. ``None`` (under torchrun on XLA):
            the rendezvous assigns it.
        world_size: the number of processes; an existing group must agree (``None`` as for rank).
        init_method: the rendezvous, or a function giving it (asked only when a group is created).
        device: a CUDA device becomes the current one before the group is created.
        in_process: a world of one through an in-process store: no rendezvous, no port to find.
        assign_ranks: pass ``rank``/``world_size`` to ``init_process_group`` (``xla://`` takes them
            from the XLA runtime instead).

    Raises:
        RuntimeError: a group exists whose rank or world size disagree with ``rank``/``world_size``.
    """
    if dist.is_initialized():
        if rank is not None and (dist.get_world_size() != world_size or dist.get_rank() != rank):
            raise RuntimeError(
                f"a process group already exists with rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"but the environment says rank {rank} of {world_size}"
            )
        return False
    if callable(init_method):
        init_method = init_method()
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
    if in_process:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif assign_ranks and rank is not None:
        dist.init_process_group(
            backend=backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
        )
    else:
        dist.init_process_group(backend=backend, init_method=init_method, timeout=timeout)
    return True


class _TorchEnvironment:
    """Shared by torchrun, SLURM and a single process: device by local rank, a gloo/nccl/xccl group."""

    name = ""

    def detect(self, request: Request) -> bool:
        return request.where.source == self.name

    def launched(self, request: Request) -> bool:
        """Whether a launcher started the process (a sharding strategy then joins even a world of one)."""
        return True

    def rendezvous(self, request: Request) -> str | None:
        return request.init_method or attempt_rendezvous(request.environ)

    def in_process(self, request: Request) -> bool:
        return False

    def locate(self, request: Request) -> Placement:
        where = request.where
        device = _pick_device(request.cpu, where.local_rank)
        launched = self.launched(request)
        joins = where.is_distributed or ((request.sharded or request.asked in SHARDED) and launched)
        backend = (request.backend or _default_backend(device)) if joins else None
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
        if request.init_method is not None:
            return request.init_method
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
        return request.init_method is None


def import_torch_xla() -> Any:
    """``torch_xla``, or a ValueError saying how to install it."""
    try:
        torch_xla = importlib.import_module("torch_xla")
        # xla_model: collectives, RNG, rendezvous; xla_backend registers the "xla" process group.
        for part in ("core.xla_model", "runtime", "distributed.xla_backend"):
            importlib.import_module(f"torch_xla.{part}")
    except ImportError as exc:
        raise ValueError(
            f"distributed_type XLA needs torch_xla, which is not importable ({exc}): {INSTALL_HINT}"
        ) from exc
    return torch_xla


class XLAEnvironment:
    """TPU (or any torch_xla device): rank, world and device from the XLA runtime, the ``xla`` group."""

    name = "xla"

    def detect(self, request: Request) -> bool:
        if request.asked == DistributedType.XLA:
            return True
        # An ambient PJRT_DEVICE picks XLA only when nothing else was asked and torch_xla is there.
        return (
            request.asked is None
            and not request.cpu
            and env.PJRT_DEVICE.is_set(request.environ)
            and importlib.util.find_spec("torch_xla") is not None
        )

    def locate(self, request: Request) -> Placement:
        """This process's replica, the ``xla`` process group joined.

        Raises:
            ValueError: torch_xla is missing, or XLA was asked together with ``cpu=True`` or
                another backend.
        """
        flag = (
            f"{env.DISTRIBUTED_TYPE.name}=XLA"
            if request.asked == DistributedType.XLA
            else f"{env.PJRT_DEVICE.name}={env.PJRT_DEVICE.read(request.environ)}"
        )
        timeout = request.group_timeout()
        if request.cpu:
            raise ValueError(f"{flag} asks for an XLA device but cpu=True was passed: drop one of them")
        if request.backend not in (None, "xla"):
            raise ValueError(f"{flag}: XLA replicas talk through the 'xla' backend, not {request.backend!r}")
        torch_xla = import_torch_xla()
        init_method = request.init_method or "xla://"
        joined = False
        if dist.is_torchelastic_launched() and not dist.is_initialized():
            # Under torchrun, torch_xla binds each process to its own device inside the xla://
            # rendezvous: asking the runtime anything first would open every device in every process.
            joined = join_group(backend="xla", init_method=init_method, timeout=timeout)
        runtime = torch_xla.runtime
        devices = runtime.addressable_device_count()
        if devices > 1:
            raise ValueError(
                f"this process drives {devices} XLA devices (TPU v2/v3 hosts, or CPU_NUM_DEVICES/GPU_NUM_DEVICES > 1); "
                "x_runtime runs one replica per process and device: start one process per device "
                "(x-launch --tpu does) on TPU v4 or newer"
            )
        world, rank = runtime.world_size(), runtime.global_ordinal()
        local_world = max(1, runtime.local_process_count())
        backend = "xla"
        if not joined:
            # A world of one joins too, so collectives take the pod's path; xla:// would bind
            # MASTER_PORT (12355 by default) for a store nobody else reads.
            joined = join_group(
                backend="xla",
                timeout=timeout,
                rank=rank,
                world_size=world,
                init_method=None if world == 1 else init_method,
                in_process=world == 1,
                assign_ranks=init_method != "xla://",  # its rendezvous takes them from the XLA runtime
            )
            if not joined:
                backend = dist.get_backend()
        # The XLA generator does not follow torch.manual_seed; starting it from torch's seed carries a
        # set_seed() made before the accelerator existed (or torch's own random seed) to the device.
        torch_xla.core.xla_model.set_rng_state(torch.initial_seed())
        return Placement(
            rank=rank,
            local_rank=runtime.local_ordinal(),
            world_size=world,
            local_world_size=local_world,
            node_rank=rank // local_world,
            device=torch_xla.device(),
            backend=backend,
            distributed_type=DistributedType.XLA,
            source="xla",
            owns_process_group=joined,
        )


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
