"""Tensor parallelism alone: every rank reads the same batch and holds its part of each layer.

The layers are split as under FSDP x TP (``FSDPStrategy._split_layers``), without ``fully_shard``
on top: a ``tp_size`` of the world, no data parallel ranks, so no gradient reduction beyond what
the split layers' own collectives do. Checkpoints go through ``torch.distributed.checkpoint`` as
FSDP's sharded ones do (each rank its part; loadable at any layout), and whole-model weights are
gathered from the parts (``save_model``, ``get_state_dict``). The run reports the environment's
own type (``MULTI_GPU``, ``MULTI_CPU``), as Accelerate does for a tensor-parallel run.
"""

from __future__ import annotations

from x_runtime.process.topology.state import ProcessState
from x_runtime.strategies.fsdp import FSDPStrategy
from x_runtime.strategies.fsdp_plugin import FullyShardedDataParallelPlugin
from x_runtime.strategies.layout import Layout

__all__ = ["TensorParallelStrategy"]


class TensorParallelStrategy(FSDPStrategy):
    """The model split over the ``tp`` mesh; state saved in parts through DCP."""

    distributed_type = None  # type: ignore[assignment]  # keeps what the process state inferred
    record_name = "tensor parallel"

    def __init__(self, state: ProcessState, mixed_precision: str, layout: Layout):
        plugin = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT")
        super().__init__(state, plugin, mixed_precision, layout)

    def _sharded_layout(self) -> bool:
        return True
