"""The XLA environment (TPU, or any torch_xla device): rank, world and device from the XLA runtime.

First in ``environments.ENVIRONMENTS`` (the module doc there says why). torch_xla is imported
here only, and only when this environment is chosen.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch
import torch.distributed as dist

from x_common import env
from x_runtime.process.topology.distributed_type import DistributedType
from x_runtime.process.topology.environment_contract import Placement, Request
from x_runtime.process.topology.join_group import join_group

__all__ = ["INSTALL_HINT", "XLAEnvironment", "import_torch_xla"]

INSTALL_HINT = (
    "pip install 'x-runtime[tpu]' on a TPU VM, or pip install torch_xla==<your torch version> "
    "(torch_xla is released for one torch version at a time)"
)


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
        if request.group.backend not in (None, "xla"):
            raise ValueError(f"{flag}: XLA replicas talk through the 'xla' backend, not {request.group.backend!r}")
        torch_xla = import_torch_xla()
        init_method = request.group.init_method or "xla://"
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
