"""Operations: what a running process does beside computing and talking to its peers.

``on_ranks`` runs code on chosen ranks, in order, or on a share of the inputs; ``logging`` logs
once per job or rank by rank; ``saving`` and ``progress_bar`` write and show from one process;
``preemption`` agrees on every rank that the job was asked to stop; ``progress`` keeps this rank's
record for x-launch's stall watchdog.
"""

from x_runtime.process.operations.logging import MultiProcessAdapter, get_logger
from x_runtime.process.operations.on_ranks import first_on, on_process, share_bounds, split_between_processes
from x_runtime.process.operations.preemption import PreemptionWatch
from x_runtime.process.operations.progress_bar import tqdm
from x_runtime.process.operations.saving import save

__all__ = [
    "MultiProcessAdapter",
    "PreemptionWatch",
    "first_on",
    "get_logger",
    "on_process",
    "save",
    "share_bounds",
    "split_between_processes",
    "tqdm",
]
