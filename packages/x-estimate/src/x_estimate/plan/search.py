"""``x-estimate MODEL --plan``: the cheapest training settings that fit N GPUs of a given memory.

Every row is a simulated CUDA step (``simulate/step.py`` with ``device="cuda"``) replayed as one
device holds it under the row's sharding and offload, with its reserved figure and headroom.
The settings searched:

- precision: ``mixed-bf16`` (autocast, float32 weights), then pure ``bf16`` (bfloat16 weights
  and AdamW state, no float32 copy: it changes the numerics, so it ranks after every
  mixed-precision setting without offload); ``--precision`` fixes one instead;
- sharding: none (DDP), zero1, zero2 (FSDP ``SHARD_GRAD_OP``), zero3 (FSDP ``FULL_SHARD``),
  over ``--gpus`` devices;
- offload: none; ``optimizer`` (DeepSpeed ZeRO-Offload, stage 2 or 3: the float32 master,
  gradients and AdamW state live in CPU memory and the step runs there; the GPU keeps 16-bit
  weights and gradients); ``params`` (FSDP ``cpu_offload`` / DeepSpeed ``offload_param``, zero3
  only: the GPU holds only the unit being computed);
- activation checkpointing on or off;
- micro-batch: each divisor of ``--batch-size`` (sequences per GPU per optimizer step), the rest
  by gradient accumulation.

Cheapest means, in this order (the first difference decides): no offload (the CPU's optimizer
step and the PCIe traffic are the slowest thing here), mixed precision before pure bf16, no
recomputation (checkpointing reruns each block's forward: about a third more compute), zero3
last among the stages (it moves the weights once more per step, 1.5x DDP's traffic; zero1 and
zero2 move what DDP moves), fewer accumulation steps (a bigger micro-batch uses the GPU better),
then the lower stage. Memory is monotonic in the micro-batch, so each setting's largest
micro-batch that fits is found by bisection, and a simulation is shared by every setting with
its precision, checkpointing and micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from x_estimate.training.memory import TrainingMemory, training_memory
from x_estimate.training.peak import gathered_bytes, gathered_segment, shard_divisors

__all__ = ["MARGIN", "OFFLOADS", "Plan", "PlanRow", "Setting", "make_plan"]

MARGIN = 1 << 30  # kept free on each GPU: the CUDA context and NCCL's buffers live outside torch's allocator
OFFLOADS = ("none", "optimizer", "params")
_PRECISIONS = ("mixed-bf16", "bf16")
_STAGES = ("none", "zero1", "zero2", "zero3")


@dataclass(frozen=True)
class Setting:
    precision: str
    shard: str  # none, zero1, zero2, zero3
    offload: str  # OFFLOADS
    checkpointing: bool
    micro_batch: int
    accumulation: int

    def cost(self, precisions: tuple[str, ...]) -> tuple[int, ...]:
        """Sort key: smaller is cheaper (see the module's docstring for the order and why)."""
        return (
            OFFLOADS.index(self.offload),
            precisions.index(self.precision),
            int(self.checkpointing),
            int(self.shard == "zero3"),
            self.accumulation,
            _STAGES.index(self.shard),
        )


@dataclass(frozen=True)
class PlanRow:
    setting: Setting
    allocated: int  # the step's peak on one GPU (torch.cuda.max_memory_allocated)
    reserved: int  # what the caching allocator holds: the figure that must fit
    headroom: int  # GPU memory left beside reserved
    host: int  # bytes of CPU memory per GPU the offload needs
    at_peak: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self.setting), **{k: v for k, v in asdict(self).items() if k != "setting"}}


@dataclass
class Plan:
    gpus: int
    gpu_memory: int
    batch_size: int
    seq_len: int
    optimizer: str
    precisions: tuple[str, ...]
    rows: list[PlanRow]  # what fits, cheapest first
    nearest: PlanRow | None  # when nothing fits: the setting that needs the least
    simulations: int
    notes: list[str] = field(default_factory=list)

    @property
    def usable(self) -> int:
        return self.gpu_memory - MARGIN


def _settings(gpus: int, precisions: tuple[str, ...]) -> list[tuple[str, str, str, bool]]:
    """(offload, precision, shard, checkpointing) for every setting worth a row."""
    stages = _STAGES if gpus > 1 else ("none",)
    out = []
    for precision in precisions:
        for checkpointing in (False, True):
            out += [("none", precision, shard, checkpointing) for shard in stages]
            # ZeRO-Offload runs on one GPU too, where its stage divides nothing: one row then.
            out += [
                ("optimizer", precision, shard, checkpointing) for shard in ("zero2", "zero3")[: 2 if gpus > 1 else 1]
            ]
            out.append(("params", precision, "zero3", checkpointing))
    return out


def _divisors(value: int) -> list[int]:
    return [d for d in range(1, value + 1) if value % d == 0]


class _Steps:
    """Simulated steps by (precision, checkpointing, micro-batch), each simulated once."""

    def __init__(self, simulate: Callable[[str, bool, int], Any]) -> None:
        self._simulate = simulate
        self._done: dict[tuple[str, bool, int], Any] = {}

    def get(self, precision: str, checkpointing: bool, micro_batch: int) -> Any:
        # mixed-fp16 and mixed-bf16 run the same step (see simulate/rows.py)
        key = ("mixed-bf16" if precision.startswith("mixed-") else precision, checkpointing, micro_batch)
        if key not in self._done:
            self._done[key] = self._simulate(*key)
        return self._done[key]

    def __len__(self) -> int:
        return len(self._done)


def _device_figures(
    step: Any, setting: Setting, gpus: int, state: TrainingMemory, unit_params: int
) -> tuple[int, int, dict[str, int]]:
    """(allocated, reserved, breakdown) of one GPU under the setting's sharding and offload."""
    n = gpus
    if setting.offload == "none":
        divisors = shard_divisors(setting.shard, n)
        extra = gathered_bytes(unit_params, state.precision) if setting.shard == "zero3" and n > 1 else 0
        skip: tuple[str, ...] = ()
    else:
        # Autocast's float32 weights and gradients become DeepSpeed's 16-bit copies on the GPU,
        # and the optimizer step runs on the CPU.
        half = 2 if setting.precision.startswith("mixed-") else 1
        divisors, skip = {"optimizer_state": 0}, ("optimizer",)
        if setting.offload == "optimizer":
            divisors["gradients"] = half * n
            divisors["weights"] = half * (n if setting.shard == "zero3" else 1)
            extra = 0
        else:  # params: the GPU holds the unit being computed and its gradients before they move off
            divisors.update(weights=0, gradients=0)
            extra = 2 * unit_params * 2
    peak, parts, _ = step.sharded(divisors, extra, skip)
    # As peak.simulated_peak counts it: the gathered unit is one more segment beside the shards.
    reserved = step.device_reserved(divisors, 0, skip) + gathered_segment(extra)
    return peak, reserved, {**parts, "gathered_layer": extra}


def _host_bytes(setting: Setting, gpus: int, state: TrainingMemory) -> int:
    """CPU memory per GPU that the offload needs (its process's share of what left the GPU)."""
    if setting.offload == "none":
        return 0
    if setting.offload == "params":
        return state.weights + state.gradients + state.optimizer_state + state.master
    gradient_bytes = 2 if state.precision == "bf16" else 4  # the CPU optimizer reads float32 gradients
    return state.optimizer_state + state.master + math.ceil(state.parameters * gradient_bytes / gpus)


def make_plan(
    tensors: list[Any],
    *,
    simulate: Callable[[str, bool, int], Any],
    gpus: int,
    gpu_memory: int,
    batch_size: int,
    seq_len: int,
    optimizer: str,
    precisions: tuple[str, ...] = _PRECISIONS,
    unit_params: int = 0,
) -> Plan:
    """Every setting's largest fitting micro-batch, simulated, the cheapest first.

    ``simulate(precision, checkpointing, micro_batch)`` returns a CUDA ``SimulatedStep`` (or an
    ``ExtrapolatedStep``); ``tensors`` are the model's (``ModelSummary.tensors``), for the
    sharded parts' formulas and the offload's host memory; ``unit_params``: parameters a zero3
    device holds gathered at once (``layers.gathered_parameters``).
    """
    steps = _Steps(simulate)
    micro_batches = sorted(_divisors(batch_size), reverse=True)
    usable = gpu_memory - MARGIN
    fitting: list[PlanRow] = []
    nearest: PlanRow | None = None

    def row(offload: str, precision: str, shard: str, checkpointing: bool, micro: int) -> PlanRow:
        setting = Setting(precision, shard, offload, checkpointing, micro, batch_size // micro)
        stage = "zero3" if offload == "params" else shard
        state = training_memory(
            tensors,
            precision=precision,
            optimizer=optimizer,
            num_devices=gpus,
            shard=stage,
            gathered_params=unit_params,
        )
        step = steps.get(precision, checkpointing, micro)
        allocated, reserved, parts = _device_figures(step, setting, gpus, state, unit_params)
        host = _host_bytes(setting, gpus, state)
        return PlanRow(setting, allocated, reserved, gpu_memory - reserved, host, parts)

    for offload, precision, shard, checkpointing in _settings(gpus, precisions):
        # Bisect for the largest micro-batch that fits: memory grows with the micro-batch.
        lo, hi, best = 0, len(micro_batches) - 1, None
        smallest = micro_batches[-1]
        while lo <= hi:
            mid = (lo + hi) // 2
            candidate = row(offload, precision, shard, checkpointing, micro_batches[mid])
            if candidate.reserved <= usable:
                best, hi = candidate, mid - 1
            else:
                lo = mid + 1
                if candidate.setting.micro_batch == smallest and (
                    nearest is None or candidate.reserved < nearest.reserved
                ):
                    nearest = candidate
        if best is not None:
            fitting.append(best)
    fitting.sort(key=lambda r: r.setting.cost(precisions))
    plan = Plan(
        gpus, gpu_memory, batch_size, seq_len, optimizer, precisions, _front(fitting, precisions), None, len(steps)
    )
    if not fitting:
        plan.nearest = nearest
    return plan


def _front(rows: list[PlanRow], precisions: tuple[str, ...]) -> list[PlanRow]:
    """The rows no cheaper row beats: each is listed only if every row before it costs more in
    some respect (offload, precision, checkpointing, zero3, accumulation steps). ``rows`` come
    cheapest first, so among equals the lower stage stays."""
    kept: list[PlanRow] = []
    for r in rows:
        cost = r.setting.cost(precisions)[:-1]
        if not any(all(a <= b for a, b in zip(k.setting.cost(precisions)[:-1], cost, strict=True)) for k in kept):
            kept.append(r)
    return kept
