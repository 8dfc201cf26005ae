"""One simulated training step's figures: its peak, its breakdown, and its replay for one device.

``simulate.py`` runs the step and fills a ``SimulatedStep``; ``layer_extrapolation.py`` answers
the same questions for a deep stack from two (or three) of them. ``sharded`` and
``device_reserved`` replay the step as one device holds it when parts of it are divided over
several (ZeRO, FSDP) or moved to the CPU (offload).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from x_estimate.cuda_step import device_reserved

__all__ = ["PARTS", "SimulatedStep"]

PARTS = ("weights", "gradients", "optimizer_state", "activations", "logits", "temporaries")


@dataclass(frozen=True)
class SimulatedStep:
    """Peak and steady-state bytes of a simulated training step, on one device."""

    peak: int
    at_peak: dict[str, int]  # PARTS -> bytes live at the peak
    steady: int  # live after optimizer.step() and zero_grad(): weights, buffers, optimizer state
    phase: str  # what the step was doing at the peak: forward, backward, optimizer
    notes: list[str] = field(default_factory=list)
    curve: list[tuple[int, int, str]] = field(default_factory=list, repr=False)  # (PARTS index, +/- bytes, phase)
    reserved: int | None = None  # device="cuda": the caching allocator's segments after a second step
    events: list[Any] | None = field(default=None, repr=False)  # device="cuda": cuda_step.Event, in order

    @property
    def activation_peak(self) -> int:
        """The most activation and logits bytes live at any moment (at the peak they may be gone)."""
        acts, logits = PARTS.index("activations"), PARTS.index("logits")
        live = best = 0
        for index, delta, _ in self.curve:
            if index in (acts, logits):
                live += delta
                best = max(best, live)
        return best

    def sharded(
        self, divisors: dict[str, int], extra_weights: int = 0, skip_phases: Collection[str] = ()
    ) -> tuple[int, dict[str, int], int]:
        """(peak, breakdown at that peak, steady state) with some parts divided, ZeRO-style.

        The whole step is replayed with ``divisors`` applied, so the peak may move (from the
        optimizer step to the start of backward, say) as it would on each device.
        ``extra_weights``: bytes every moment also holds (a gathered ZeRO-3 unit);
        ``skip_phases``: phases that run elsewhere (an offloaded optimizer step), not peaks here.
        """
        maxima, steady = self.phase_maxima(divisors)
        maxima = {phase: m for phase, m in maxima.items() if phase not in skip_phases}
        best = max(maxima.values(), key=lambda m: m[0], default=(0, dict.fromkeys(PARTS, 0)))
        parts = dict(best[1])
        parts["weights"] += extra_weights
        return best[0] + extra_weights, parts, steady + extra_weights

    def device_reserved(
        self, divisors: dict[str, int], extra_weights: int = 0, skip_phases: Collection[str] = ()
    ) -> int | None:
        """A CUDA step's reserved bytes on one device under ``sharded``'s arguments; None on CPU."""
        if self.events is None:
            return None
        divided = [divisors.get(p, 1) for p in PARTS]
        return device_reserved(
            self.events, divided, skip_phases, extra_weights, (_TEMPS, PARTS.index("optimizer_state"))
        )

    def phase_maxima(self, divisors: dict[str, int]) -> tuple[dict[str, tuple[int, dict[str, int]]], int]:
        """The largest moment of each phase, {phase: (bytes, breakdown)}, and the steady state.

        A divisor of 0 takes the part off the device (offloaded to the CPU). The optimizer
        step's temporaries are divided as its state is: a sharded optimizer steps its shard.
        """
        # One more bucket: the optimizer step's temporaries, folded into "temporaries" at the end.
        div = [divisors.get(part, 1) for part in PARTS] + [divisors.get("optimizer_state", 1)]
        live = [0] * len(div)
        maxima: dict[str, tuple[int, list[int]]] = {}
        for index, delta, phase in self.curve:
            live[_OPTIMIZER_TEMPS if index == _TEMPS and phase == "optimizer" else index] += delta
            if delta > 0:
                total = sum(_share(v, d) for v, d in zip(live, div, strict=True))
                if total > maxima.get(phase, (-1, None))[0]:
                    maxima[phase] = (total, list(live))
        out = {phase: (total, _breakdown(at, div)) for phase, (total, at) in maxima.items()}
        return out, sum(_share(v, d) for v, d in zip(live, div, strict=True))


_TEMPS = PARTS.index("temporaries")
_OPTIMIZER_TEMPS = len(PARTS)


def _breakdown(live: list[int], div: list[int]) -> dict[str, int]:
    parts = {p: _share(v, d) for p, v, d in zip(PARTS, live, div, strict=False)}
    parts["temporaries"] += _share(live[_OPTIMIZER_TEMPS], div[_OPTIMIZER_TEMPS])
    return parts


def _share(nbytes: int, divisor: int) -> int:
    """One device's bytes of a part divided over ``divisor`` devices; 0: the part is not on the device."""
    return -(-nbytes // divisor) if divisor else 0
