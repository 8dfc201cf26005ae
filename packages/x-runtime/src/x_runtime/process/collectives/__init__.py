"""Collectives: how processes talk, over nested structures of tensors and over pickled objects.

Every function works on the default ``torch.distributed`` process group and takes the nested
containers of :mod:`x_runtime.core.nested`; without an initialized group, or in a world of one
process, each returns what a one-process world would, so one script runs with and without a
launcher. ``gather`` and ``pad_across_processes`` check shapes on every call (``shapes``: one
small header exchange, so every process raises the same error or none); the others check in
debug mode (``debug``). ``gathering`` folds the header and the data into one collective,
``transfer`` answers the backend's device and dtype quirks for all of them, and ``shared_int``
broadcasts an integer that is read later.
"""

from x_runtime.process.collectives.broadcasting import (
    broadcast,
    broadcast_int,
    broadcast_object_list,
    copy_tensor_to_devices,
)
from x_runtime.process.collectives.debug import debug_mode, set_debug_mode, verify_operation
from x_runtime.process.collectives.errors import CannotPadNestedTensorWarning, DistributedOperationException
from x_runtime.process.collectives.gathering import gather, gather_object
from x_runtime.process.collectives.padding import pad_across_processes
from x_runtime.process.collectives.reduction import reduce
from x_runtime.process.collectives.shared_int import SharedInt, share_int
from x_runtime.process.collectives.world import barrier, rank, world_size

# The collective functions answer to the path they are imported from, as numpy's do: their reprs,
# pickles, doctests and the served ``accelerate.utils`` names show it, whichever module holds them.
for _function in (
    barrier,
    broadcast,
    broadcast_int,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    rank,
    reduce,
    world_size,
):
    _function.__module__ = __name__
del _function

__all__ = [
    "CannotPadNestedTensorWarning",
    "DistributedOperationException",
    "SharedInt",
    "barrier",
    "broadcast",
    "broadcast_int",
    "broadcast_object_list",
    "copy_tensor_to_devices",
    "debug_mode",
    "gather",
    "gather_object",
    "pad_across_processes",
    "rank",
    "reduce",
    "set_debug_mode",
    "share_int",
    "verify_operation",
    "world_size",
]
