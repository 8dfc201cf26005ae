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
  by gradient accumulation;
- layout, in Accelerate's ParallelismConfig terms: tensor parallelism of each degree ``tp`` the
  model's own plan splits evenly (``model/tensor_parallel.py``), with FSDP2 over the
  ``dp_shard = gpus / tp`` ranks left (pure TP when none are); over several machines
  (``machines``), TP within one machine and HSDP: ``dp_replicate`` = machines replicas, each
  sharded over one machine's GPUs (``dp_shard`` = GPUs per machine / tp). A TP row's figure is
  the simulated step of the model one TP rank holds, divided over ``dp_shard`` as zero3 divides
  the whole model's; an HSDP row's equals FSDP's over ``dp_shard`` ranks.

Cheapest means, in this order (the first difference decides): no offload (the CPU's optimizer
step and the PCIe traffic are the slowest thing here), a lower TP degree (TP all-reduces the
activations of every attention and MLP block, forward and backward, on the critical path: a TP
row ranks after every data-parallel row that fits as well), mixed precision before pure bf16, no
recomputation (checkpointing reruns each block's forward: about a third more compute), weight
gathers last among the stages (zero3 moves the weights once more per step, 1.5x DDP's traffic;
zero1 and zero2 move what DDP moves), gathers within a machine before gathers across machines
(HSDP before FSDP over every machine's GPUs), fewer accumulation steps (a bigger micro-batch
uses the GPU better), then the lower stage. Memory is monotonic in the micro-batch, so each setting's largest
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
    shard: str  # none, zero1, zero2, zero3 (FSDP2 over the dp_shard ranks)
    offload: str  # OFFLOADS
    checkpointing: bool
    micro_batch: int
    accumulation: int
    tp: int = 1  # tensor-parallel degree (Accelerate's tp_size)
    dp_replicate: int = 1  # replica groups of HSDP (dp_replicate_size); 1: one group, FSDP or DDP

    def dp_shard(self, gpus: int) -> int:
        """The ranks a shard group spans (Accelerate's dp_shard_size): 1 without sharding or FSDP."""
        return gpus // (self.tp * self.dp_replicate) if self.shard != "none" else 1

    def parallelism(self, gpus: int) -> dict[str, int]:
        """Accelerate's ParallelismConfig sizes of the row: dp_replicate_size, dp_shard_size, tp_size."""
        return {"dp_replicate_size": self.dp_replicate, "dp_shard_size": self.dp_shard(gpus), "tp_size": self.tp}

    def layout(self, gpus: int) -> str:
        """The row's layout in Accelerate's ParallelismConfig terms, e.g. ``FSDP2 x TP dp_shard=4 tp=2``."""
        if self.tp == 1 and self.dp_replicate == 1:
            return self.shard
        sizes = []
        if self.dp_replicate > 1:
            sizes.append(f"dp_replicate={self.dp_replicate}")
        if self.shard != "none":
            sizes.append(f"dp_shard={self.dp_shard(gpus)}")
        if self.tp > 1:
            sizes.append(f"tp={self.tp}")
        kind = "HSDP" if self.dp_replicate > 1 else "FSDP2" if self.shard != "none" else ""
        kind = " x ".join(k for k in (kind, "TP" if self.tp > 1 else "") if k)
        return f"{kind} {' '.join(sizes)}"

    def cost(self, precisions: tuple[str, ...], *, gpus: int = 1, machines: int = 1) -> tuple[int, ...]:
        """Sort key: smaller is cheaper (see the module's docstring for the order and why)."""
        return (
            OFFLOADS.index(self.offload),
            self.tp,
            precisions.index(self.precision),
            int(self.checkpointing),
            self._gathers(gpus, machines),
            self.accumulation,
            _STAGES.index(self.shard),
        )

    def _gathers(self, gpus: int, machines: int) -> int:
        """0: no weight gathers (DDP's traffic, zero1, zero2, pure TP); 1: FSDP's gathers within a
        machine; 2: gathers that cross machines (a shard group wider than one machine)."""
        if self.shard != "zero3":
            return 0
        span = self.dp_shard(gpus) * self.tp  # the tp ranks are inner: a shard group strides over them
        return 2 if machines > 1 and span > gpus // machines else 1


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
    machines: int = 1
    tp_degrees: tuple[int, ...] = ()  # the TP degrees searched (the model's plan splits them evenly)

    @property
    def usable(self) -> int:
        return self.gpu_memory - MARGIN


_Candidate = tuple[str, str, str, bool, int, int]  # offload, precision, shard, checkpointing, tp, dp_replicate


def _layouts(gpus: int, machines: int, tp_degrees: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """(shard, tp, dp_replicate) of the TP and HSDP layouts, beside the data-parallel stages.

    FSDP2 x TP: the ranks left by TP shard (dp_shard = gpus / tp; pure TP when none are left).
    Over several machines, TP stays within one and HSDP replicates over the machines, each
    replica sharded over the GPUs of one machine (divided by tp): Accelerate refuses TP beside
    replicas without sharding, so an HSDP layout needs dp_shard > 1.
    """
    out = []
    for tp in (1, *tp_degrees):
        if tp > 1:
            out.append(("zero3" if gpus > tp else "none", tp, 1))
        if machines > 1 and gpus // (machines * tp) > 1:
            out.append(("zero3", tp, machines))
    return out


def _settings(
    gpus: int, precisions: tuple[str, ...], machines: int = 1, tp_degrees: tuple[int, ...] = ()
) -> list[_Candidate]:
    """(offload, precision, shard, checkpointing, tp, dp_replicate) for every setting worth a row."""
    stages = _STAGES if gpus > 1 else ("none",)
    out: list[_Candidate] = []
    for precision in precisions:
        for checkpointing in (False, True):
            out += [("none", precision, shard, checkpointing, 1, 1) for shard in stages]
            out += [
                ("none", precision, shard, checkpointing, tp, r)
                for shard, tp, r in _layouts(gpus, machines, tp_degrees)
            ]
            # ZeRO-Offload runs on one GPU too, where its stage divides nothing: one row then.
            out += [
                ("optimizer", precision, shard, checkpointing, 1, 1)
                for shard in ("zero2", "zero3")[: 2 if gpus > 1 else 1]
            ]
            out.append(("params", precision, "zero3", checkpointing, 1, 1))
    return out


def _divisors(value: int) -> list[int]:
    return [d for d in range(1, value + 1) if value % d == 0]


class _Steps:
    """Simulated steps by (precision, checkpointing, micro-batch, TP degree), each simulated once."""

    def __init__(self, simulate: Callable[[str, bool, int, int], Any]) -> None:
        self._simulate = simulate
        self._done: dict[tuple[str, bool, int, int], Any] = {}

    def get(self, precision: str, checkpointing: bool, micro_batch: int, tp: int = 1) -> Any:
        # mixed-fp16 and mixed-bf16 run the same step (see simulate/rows.py)
        key = ("mixed-bf16" if precision.startswith("mixed-") else precision, checkpointing, micro_batch, tp)
        if key not in self._done:
            self._done[key] = self._simulate(*key)
        return self._done[key]

    def __len__(self) -> int:
        return len(self._done)


def _device_figures(
    step: Any, setting: Setting, gpus: int, state: TrainingMemory, unit_params: int
) -> tuple[int, int, dict[str, int]]:
    """(allocated, reserved, breakdown) of one GPU under the setting's sharding and offload.

    ``step`` is the model one rank holds (a TP rank's for tp > 1), whose weights, gradients and
    optimizer state FSDP divides over the dp_shard ranks, gathering its units as under zero3.
    """
    n = setting.dp_shard(gpus) if setting.offload == "none" else gpus
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
    simulate: Callable[[str, bool, int, int], Any],
    gpus: int,
    gpu_memory: int,
    batch_size: int,
    seq_len: int,
    optimizer: str,
    precisions: tuple[str, ...] = _PRECISIONS,
    unit_params: int = 0,
    machines: int = 1,
    tp_units: dict[int, int] | None = None,
) -> Plan:
    """Every setting's largest fitting micro-batch, simulated, the cheapest first.

    ``simulate(precision, checkpointing, micro_batch, tp)`` returns a CUDA ``SimulatedStep`` (or
    an ``ExtrapolatedStep``) of the model one rank of a ``tp``-way split holds (the whole model
    for 1); ``tensors`` are the model's (``ModelSummary.tensors``), for the sharded parts'
    formulas and the offload's host memory; ``unit_params``: parameters a zero3 device holds
    gathered at once (``layers.gathered_parameters``); ``tp_units``: {TP degree: the same count
    of a TP rank's model} for each degree to search (those that divide a machine's GPUs);
    ``machines``: the machines the ``gpus`` are spread over (HSDP replicates over them).
    """
    units = {1: unit_params, **{tp: n for tp, n in (tp_units or {}).items() if (gpus // machines) % tp == 0}}
    tp_degrees = tuple(sorted(tp for tp in units if tp > 1))
    steps = _Steps(simulate)
    micro_batches = sorted(_divisors(batch_size), reverse=True)
    usable = gpu_memory - MARGIN
    fitting: list[PlanRow] = []
    nearest: PlanRow | None = None

    def row(candidate: _Candidate, micro: int) -> PlanRow:
        offload, precision, shard, checkpointing, tp, replicas = candidate
        setting = Setting(precision, shard, offload, checkpointing, micro, batch_size // micro, tp, replicas)
        stage = "zero3" if offload == "params" else shard
        state = training_memory(
            tensors,
            precision=precision,
            optimizer=optimizer,
            num_devices=gpus,
            shard=stage,
            gathered_params=unit_params,
        )
        step = steps.get(precision, checkpointing, micro, tp)
        allocated, reserved, parts = _device_figures(step, setting, gpus, state, units[tp])
        host = _host_bytes(setting, gpus, state)
        return PlanRow(setting, allocated, reserved, gpu_memory - reserved, host, parts)

    for candidate in _settings(gpus, precisions, machines, tp_degrees):
        # Bisect for the largest micro-batch that fits: memory grows with the micro-batch.
        lo, hi, best = 0, len(micro_batches) - 1, None
        smallest = micro_batches[-1]
        while lo <= hi:
            mid = (lo + hi) // 2
            tried = row(candidate, micro_batches[mid])
            if tried.reserved <= usable:
                best, hi = tried, mid - 1
            else:
                lo = mid + 1
                if tried.setting.micro_batch == smallest and (nearest is None or tried.reserved < nearest.reserved):
                    nearest = tried
        if best is not None:
            fitting.append(best)
    fitting.sort(key=lambda r: r.setting.cost(precisions, gpus=gpus, machines=machines))
    plan = Plan(
        gpus, gpu_memory, batch_size, seq_len, optimizer, precisions, _front(fitting, precisions, gpus, machines),
        None, len(steps), machines=machines, tp_degrees=tp_degrees,
    )  # fmt: skip
    if not fitting:
        plan.nearest = nearest
    return plan


def _front(rows: list[PlanRow], precisions: tuple[str, ...], gpus: int, machines: int) -> list[PlanRow]:
    """The rows no cheaper row beats: each is listed only if every row before it costs more in
    some respect (offload, TP degree, precision, checkpointing, gathers, accumulation steps).
    ``rows`` come cheapest first, so among equals the lower stage stays."""
    kept: list[PlanRow] = []

    def cost(r: PlanRow) -> tuple[int, ...]:
        return r.setting.cost(precisions, gpus=gpus, machines=machines)[:-1]

    for r in rows:
        if not any(all(a <= b for a, b in zip(cost(k), cost(r), strict=True)) for k in kept):
            kept.append(r)
    return kept
