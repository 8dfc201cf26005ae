"""Training memory as a sum with its parts: weights, gradients, optimizer state, fp32 master copy.

Bytes per parameter (``P`` trainable parameters; frozen parameters count as weights only, and
buffers are added to the weights unsharded):

| precision   | weights | gradients | master | optimizer state dtype |
|-------------|---------|-----------|--------|-----------------------|
| fp32        | 4       | 4         | 0      | float32 (4)           |
| mixed-bf16  | 2       | 2         | 4      | float32 (4)           |
| mixed-fp16  | 2       | 2         | 4      | float32 (4)           |
| bf16        | 2       | 2         | 0      | bfloat16 (2)          |

Optimizer state per parameter, ``s`` the state dtype's bytes: adamw ``2s``; adamw8bit 2 bytes +
a float32 absmax per 256 values for each of its two states; sgd (with momentum) ``s``;
adafactor (factored, no first moment) ``s*(rows + cols)`` per matrix, ``s*n`` per vector.
Mixed-precision Adam thus costs 2 + 2 + 4 + 8 = 16 B/param, the ZeRO paper's figure
(Rajbhandari et al., 2020). ``torch.autocast`` keeps float32 weights and gradients instead of
a master copy: 4 + 4 + 8, the same 16 B/param.

Sharding over ``N`` devices divides (ZeRO stage / FSDP): zero1 the optimizer state and master
copy, zero2 also the gradients, zero3 and fsdp also the weights; zero3 and fsdp then gather one
unit at a time, and at the peak each device holds the root unit (what no block holds: embeddings,
head) and one block gathered whole, in the weight dtype (``layers.gathered_parameters``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from x_common.module_sizes import TensorInfo

__all__ = ["OPTIMIZERS", "PRECISIONS", "SHARDS", "TrainingMemory", "training_memory"]

OPTIMIZERS = ("adamw", "adamw8bit", "sgd", "adafactor")
PRECISIONS = ("fp32", "mixed-bf16", "mixed-fp16", "bf16")
SHARDS = ("none", "zero1", "zero2", "zero3", "fsdp")

# precision: (weight bytes, gradient bytes, master bytes, optimizer state bytes)
_PRECISION = {
    "fp32": (4, 4, 0, 4),
    "mixed-bf16": (2, 2, 4, 4),
    "mixed-fp16": (2, 2, 4, 4),
    "bf16": (2, 2, 0, 2),
}


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes on one device; ``parameters`` counts trainable parameters once (tied ones once)."""

    precision: str
    optimizer: str
    shard: str
    num_devices: int
    parameters: int
    weights: int
    gradients: int
    optimizer_state: int
    master: int
    gathered_layer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_state + self.master + self.gathered_layer

    @property
    def bytes_per_param(self) -> float:
        return self.total / self.parameters if self.parameters else 0.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "total": self.total, "bytes_per_param": round(self.bytes_per_param, 4)}


def _optimizer_bytes(params: list[TensorInfo], optimizer: str, state_bytes: int) -> int:
    count = sum(p.numel for p in params)
    if optimizer == "adamw":
        return 2 * state_bytes * count
    if optimizer == "adamw8bit":
        return sum(2 * (p.numel + 4 * math.ceil(p.numel / 256)) for p in params)
    if optimizer == "sgd":
        return state_bytes * count
    total = 0
    for p in params:  # adafactor
        if len(p.shape) >= 2:
            rows = math.prod(p.shape[:-1])
            cols = math.prod(p.shape[:-2]) * p.shape[-1]
            total += state_bytes * (rows + cols)
        else:
            total += state_bytes * p.numel
    return total


def training_memory(
    tensors: list[TensorInfo],
    *,
    precision: str = "fp32",
    optimizer: str = "adamw",
    num_devices: int = 1,
    shard: str = "none",
    gathered_params: int = 0,
) -> TrainingMemory:
    """Per-device training memory of a model's ``tensors`` (weights, gradients, optimizer, master).

    Trainable parameters are those with ``requires_grad``; other parameters and buffers count
    as weights only. ``gathered_params``: parameters a device holds
    gathered whole under zero3/fsdp.

    Examples:
        >>> w = TensorInfo(("fc.weight",), (1000, 1000), "float32", requires_grad=True)
        >>> training_memory([w], precision="mixed-bf16").bytes_per_param
        16.0
    """
    if precision not in _PRECISION:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
    if shard not in SHARDS:
        raise ValueError(f"unknown sharding {shard!r}; expected one of {', '.join(SHARDS)}")
    if num_devices < 1:
        raise ValueError(f"invalid device count {num_devices}: must be >= 1")
    w_bytes, g_bytes, m_bytes, s_bytes = _PRECISION[precision]
    params = [t for t in tensors if t.is_parameter and t.requires_grad]
    count = sum(p.numel for p in params)
    weight_dtype = "bfloat16" if w_bytes == 2 else "float32"
    # Frozen parameters are weights without gradients or state (ZeRO-3/FSDP still shard them);
    # buffers are never sharded.
    frozen = sum(t.nbytes(weight_dtype) for t in tensors if t.is_parameter and not t.requires_grad)
    buffers = sum(t.nbytes(weight_dtype) for t in tensors if not t.is_parameter)

    weights, gradients = count * w_bytes + frozen, count * g_bytes
    master, state = count * m_bytes, _optimizer_bytes(params, optimizer, s_bytes)
    n = num_devices if shard != "none" else 1
    if shard in ("zero1", "zero2", "zero3", "fsdp"):
        state, master = math.ceil(state / n), math.ceil(master / n)
    if shard in ("zero2", "zero3", "fsdp"):
        gradients = math.ceil(gradients / n)
    gathered = 0
    if shard in ("zero3", "fsdp"):
        weights = math.ceil(weights / n)
        gathered = gathered_params * w_bytes if n > 1 else 0
    return TrainingMemory(
        precision, optimizer, shard, num_devices, count, weights + buffers, gradients, state, master, gathered
    )
