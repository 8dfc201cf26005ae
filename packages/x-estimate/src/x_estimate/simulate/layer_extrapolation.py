"""Simulate two and three blocks of a deep stack of identical blocks, and extrapolate the rest.

A fake step's cost is per op, and a decoder of ``N`` identical blocks runs each block's ops
``N`` times; its memory, moment by moment, grows by the same bytes per block (each block holds
the same weights, state and saved activations). So every phase's largest moment is linear in
``N``: simulating with 2 and 3 blocks gives its slope and offset exactly, and the peak of the
whole model is the largest of the extrapolated phase maxima (a phase may overtake another as
``N`` grows: each is extrapolated on its own). Applies only to a stack that is truly uniform:
one ``ModuleList`` of at least ``MIN_BLOCKS`` children of one class with the same parameter
shapes, the config's ``num_hidden_layers`` naming its length and one ``layer_types`` value, if
any. Anything else (T5's first block with its position bias, Gemma's mixed sliding layers) is
simulated whole. tests/simulate/test_layer_extrapolation.py checks the result equals a whole simulation.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["MIN_BLOCKS", "ExtrapolatedStep", "uniform_stack"]

MIN_BLOCKS = 6


def _signature(module: torch.nn.Module) -> tuple[Any, ...]:
    return (type(module), tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()))


def uniform_stack(model: torch.nn.Module, config: Any) -> tuple[torch.nn.Module, str] | None:
    """(parent, attribute) of the model's uniform block list, or None when there is none."""
    if config is None or not isinstance(getattr(config, "num_hidden_layers", None), int):
        return None
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(set(types)) > 1:
        return None
    if any(getattr(config, key, None) for key in ("first_k_dense_replace", "decoder_sparse_step", "moe_layer_freq")):
        return None
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, torch.nn.ModuleList) and len(child) == config.num_hidden_layers:
                found.append((parent, name, child))
    if len(found) != 1:
        return None
    parent, name, blocks = found[0]
    if len(blocks) < MIN_BLOCKS or len({_signature(b) for b in blocks}) != 1:
        return None
    return parent, name


@dataclass(frozen=True)
class ExtrapolatedStep:
    """A ``SimulatedStep``-like answer for ``blocks`` blocks, from simulations of 2 and 3."""

    two: Any
    three: Any
    blocks: int
    notes: list[str] = field(default_factory=list)
    four: Any = None  # a CUDA step with four blocks, run when the allocator's overhead grows from two to three

    def _line(self, a: int, b: int) -> int:
        return b + (self.blocks - 3) * (b - a)

    def _maxima(self, divisors: dict[str, int]) -> tuple[dict[str, tuple[int, dict[str, int]]], int]:
        (m2, s2), (m3, s3) = self.two.phase_maxima(divisors), self.three.phase_maxima(divisors)
        out = {}
        for phase in m2.keys() & m3.keys():
            (t2, p2), (t3, p3) = m2[phase], m3[phase]
            out[phase] = (self._line(t2, t3), {k: self._line(p2[k], p3[k]) for k in p2})
        return out, self._line(s2, s3)

    def sharded(
        self, divisors: dict[str, int], extra_weights: int = 0, skip_phases: Collection[str] = ()
    ) -> tuple[int, dict[str, int], int]:
        maxima, steady = self._maxima(divisors)
        total, parts = max((m for phase, m in maxima.items() if phase not in skip_phases), key=lambda m: m[0])
        return total + extra_weights, {**parts, "weights": parts["weights"] + extra_weights}, steady + extra_weights

    def device_reserved(
        self, divisors: dict[str, int], extra_weights: int = 0, skip_phases: Collection[str] = ()
    ) -> int | None:
        """``reserved`` on one device under ``sharded``'s arguments, extrapolated by the same rule."""
        args = (divisors, extra_weights, skip_phases)
        runs = [self.two, self.three] + ([self.four] if self.four is not None else [])
        overheads = []
        for run in runs:
            reserved = run.device_reserved(*args)
            if reserved is None:
                return None
            overheads.append(reserved - run.sharded(*args)[0])
        return self.sharded(*args)[0] + self._overhead(overheads)

    def _overhead(self, overheads: list[int]) -> int:
        """The allocator's overhead over the peak at ``blocks`` blocks, from the runs' (2, 3[, 4]).

        Growing, it follows the line through the last two runs: from three to four blocks when
        there is a four-block run, since the step from two to three also holds the first block's
        own fragmentation (a 7B Llama under checkpointing: +740 MiB from two to three blocks,
        +111 MiB from three to four, +108 from four to five). Shrinking, it is held at the last
        run's value: the gaps a repeated block can fill do not keep shrinking.
        """
        before, last = overheads[-2], overheads[-1]
        if last < before:
            return last
        return last + (self.blocks - 1 - len(overheads)) * (last - before)

    @property
    def peak(self) -> int:
        return self.sharded({})[0]

    @property
    def at_peak(self) -> dict[str, int]:
        return self.sharded({})[1]

    @property
    def steady(self) -> int:
        return self.sharded({})[2]

    @property
    def phase(self) -> str:
        maxima, _ = self._maxima({})
        return max(maxima, key=lambda phase: maxima[phase][0])

    @property
    def reserved(self) -> int | None:
        """A CUDA simulation's reserved bytes: the extrapolated peak plus the allocator's overhead
        over the peak (reserved - peak). An approximation, where the peak is exact: a growing
        overhead is put on the line through the two- and three-block runs; a shrinking one (the
        third block's tensors filled gaps the others left) is held at the three-block value, since
        the gaps a repeated block can fill do not keep shrinking: on a line it would soon vanish."""
        runs = [self.two, self.three] + ([self.four] if self.four is not None else [])
        if any(run.reserved is None for run in runs):
            return None
        return self.peak + self._overhead([run.reserved - run.peak for run in runs])

    @property
    def activation_peak(self) -> int:
        return self._line(self.two.activation_peak, self.three.activation_peak)
