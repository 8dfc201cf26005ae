"""Processes: where this one sits, how processes talk, and what a process does while it runs.

``topology`` places the process (``ProcessState``, the cluster ``environments`` it can be started
in, joining the process group); ``collectives`` gathers, reduces, pads and broadcasts nested
structures after a cheap shape check; ``operations`` runs code on chosen ranks, logs once per job
or rank by rank, saves from one process, and watches for preemption and stalls. Collectives
import nothing from the other two, topology only collectives (its barrier), and operations both.
"""

from x_runtime.process.collectives import (
    DistributedOperationException,
    barrier,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    debug_mode,
    gather,
    gather_object,
    pad_across_processes,
    rank,
    reduce,
    set_debug_mode,
    verify_operation,
    world_size,
)
from x_runtime.process.operations import (
    MultiProcessAdapter,
    first_on,
    get_logger,
    on_process,
    share_bounds,
    split_between_processes,
)
from x_runtime.process.topology import (
    ENVIRONMENTS,
    ClusterEnvironment,
    DistributedType,
    Placement,
    ProcessState,
    join_group,
)

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
