"""Processes: where this one runs, the cluster environments, collectives, and running code on some ranks.

``state`` (``ProcessState``: rank, world, device, process group) is built from the first of the
ordered ``environments`` that detects the process (XLA, torchrun, SLURM, single);
``collectives`` gathers, reduces, pads and broadcasts nested structures after a cheap shape
check (``_shape_check``, ``_transfer``); ``helpers`` runs code on chosen ranks, in order, or on
a share of the inputs; ``logging`` logs once per job or rank by rank.
"""

from x_runtime.process.collectives import (
    barrier,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    rank,
    reduce,
    world_size,
)
from x_runtime.process.debug import debug_mode, set_debug_mode, verify_operation
from x_runtime.process.distributed_type import DistributedType
from x_runtime.process.environments import ENVIRONMENTS, ClusterEnvironment, Placement, join_group
from x_runtime.process.errors import DistributedOperationException
from x_runtime.process.helpers import first_on, on_process, share_bounds, split_between_processes
from x_runtime.process.logging import MultiProcessAdapter, get_logger
from x_runtime.process.state import ProcessState

__all__ = [
    "ENVIRONMENTS",
    "ClusterEnvironment",
    "DistributedOperationException",
    "DistributedType",
    "MultiProcessAdapter",
    "Placement",
    "ProcessState",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "copy_tensor_to_devices",
    "debug_mode",
    "first_on",
    "gather",
    "gather_object",
    "get_logger",
    "join_group",
    "on_process",
    "pad_across_processes",
    "rank",
    "reduce",
    "set_debug_mode",
    "share_bounds",
    "split_between_processes",
    "verify_operation",
    "world_size",
]
