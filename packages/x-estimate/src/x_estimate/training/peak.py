"""A row's training peak and what it is made of, from a simulated step or from the formulas.

Simulated (``method="simulate"``): the peak of the simulated step and the storages live at it.
Under ``--shard`` over ``N`` devices, the step is replayed with the parts ZeRO divides divided
(zero1: optimizer state; zero2: also gradients; zero3/fsdp: also weights, plus one gathered
placement unit on every device), so each device's peak may fall at another moment than the
unsharded one.

Formula (``method="formula"``): the static sum of ``memory.py`` (weights + gradients +
optimizer state + master copy) plus the Korthikanti activations, when ``--seq-len`` is given.
It counts gradients that do not exist yet at the usual peak (the start of backward) and leaves
out the logits and every temporary: see docs/estimate.md for how far off that is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from x_estimate.cuda.caching_allocator import ROUND_LARGE
from x_estimate.training.memory import TrainingMemory

__all__ = ["PeakFigures", "formula_peak", "gathered_bytes", "gathered_segment", "shard_divisors", "simulated_peak"]

_DIVIDED = {
    "zero1": ("optimizer_state",),
    "zero2": ("optimizer_state", "gradients"),
    "zero3": ("optimizer_state", "gradients", "weights"),
    "fsdp": ("optimizer_state", "gradients", "weights"),
}


def shard_divisors(shard: str, num_devices: int) -> dict[str, int]:
    """{part: N} for the parts ``shard`` divides over ``num_devices`` (none under plain data parallel)."""
    if shard == "none" or num_devices == 1:
        return {}
    return dict.fromkeys(_DIVIDED[shard], num_devices)


@dataclass(frozen=True)
class PeakFigures:
    method: str  # "simulate" or "formula"
    peak: int
    at_peak: dict[str, int]
    steady: int | None = None
    phase: str | None = None
    notes: list[str] = field(default_factory=list)
    activations: int = 0  # the most activation (and logits) bytes the step holds at once
    reserved: int | None = None  # a CUDA simulation: the caching allocator's segments (see cuda/caching_allocator.py)

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "activation_peak_bytes": self.activations,
            "peak_bytes": self.peak,
            "reserved_bytes": self.reserved,
            "at_peak": dict(self.at_peak),
            "steady_bytes": self.steady,
            "peak_phase": self.phase,
            "notes": list(self.notes),
        }


def simulated_peak(step: Any, training: TrainingMemory, *, gathered_weight_bytes: int) -> PeakFigures:
    """Per-device figures of a ``SimulatedStep`` under ``training``'s sharding."""
    n = training.num_devices
    if training.shard == "none" or n == 1:
        at_peak = {**step.at_peak, "master": 0, "gathered_layer": 0}
        reserved = getattr(step, "reserved", None)
        return PeakFigures(
            "simulate", step.peak, at_peak, step.steady, step.phase, list(step.notes), step.activation_peak, reserved
        )
    divisors = shard_divisors(training.shard, n)
    extra = gathered_weight_bytes if training.shard in ("zero3", "fsdp") else 0
    peak, parts, steady = step.sharded(divisors, extra_weights=0)
    parts = {**parts, "master": 0, "gathered_layer": extra}
    # The gathered unit as its own segment (rounded as the allocator rounds a large one), beside the
    # replayed shards: the same figure whether the step is fresh or from the simulation cache.
    base = step.device_reserved(divisors)
    reserved = None if base is None else base + gathered_segment(extra)
    return PeakFigures(
        "simulate", peak + extra, parts, steady + extra, None, list(step.notes), step.activation_peak, reserved
    )


def gathered_bytes(params: int, precision: str) -> int:
    """Bytes of ``params`` gathered whole: the step's weight dtype (float32 under autocast)."""
    return params * (2 if precision == "bf16" else 4)


def gathered_segment(nbytes: int) -> int:
    """The segment the allocator reserves for a gathered block of ``nbytes`` (rounded as a large one)."""
    return -(-nbytes // ROUND_LARGE) * ROUND_LARGE


def formula_peak(training: TrainingMemory, activations: int | None) -> PeakFigures:
    at_peak = {
        "weights": training.weights,
        "gradients": training.gradients,
        "optimizer_state": training.optimizer_state,
        "activations": activations or 0,
        "logits": 0,
        "temporaries": 0,
        "master": training.master,
        "gathered_layer": training.gathered_layer,
    }
    return PeakFigures("formula", training.total + (activations or 0), at_peak, activations=activations or 0)
