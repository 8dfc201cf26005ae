"""Which training figures are simulated, and the simulations themselves, one per precision.

``--method auto`` (the default) simulates when ``--seq-len`` is given (a step needs inputs) and
falls back to the formulas, with a note naming why, when the step cannot run on fake tensors;
without ``--seq-len`` it uses the formulas. ``--method simulate`` insists (and needs
``--seq-len``); ``--method formula`` never simulates.

``mixed-fp16`` and ``mixed-bf16`` share one simulation: under autocast both keep float32
weights and run 16-bit activations of the same sizes (the fp16 loss scaler's few scalars are
not counted). One meta skeleton serves every simulation; it is built here because the summary
may come from the cache, which holds no model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["METHODS", "Simulations", "run_simulations"]

METHODS = ("auto", "simulate", "formula")


@dataclass
class Simulations:
    """Simulated steps by precision; ``reason`` says why there are none (formula fallback)."""

    steps: dict[str, Any] = field(default_factory=dict)  # precision -> SimulatedStep
    reason: str | None = None


def _key(precision: str) -> str:
    return "mixed-16" if precision.startswith("mixed-") else precision


def run_simulations(
    build: Callable[[], Any],
    precisions: list[str],
    *,
    optimizer: str,
    batch_size: int,
    seq_len: int,
    checkpointing: bool,
    attn_implementation: str | None,
    free_outputs: bool = False,
    device: str = "cpu",
) -> Simulations:
    """Simulate one step per distinct precision; ``build()`` returns the meta ``Skeleton``.

    A simulation that cannot run yields ``Simulations(reason=...)`` rather than an exception, so
    the report falls back to the formulas and says why.
    """
    from x_estimate.simulate.error import SimulationError
    from x_estimate.simulate.step import simulate_training

    if not precisions:
        return Simulations()
    try:
        skeleton = build()
    except Exception as exc:  # the formula path already built it once: this should not happen
        return Simulations(reason=f"the model could not be rebuilt for the simulation ({exc})")
    done: dict[str, Any] = {}
    out = Simulations()
    for precision in precisions:
        key = _key(precision)
        if key not in done:
            try:
                done[key] = simulate_training(
                    skeleton.model,
                    skeleton.config,
                    precision="mixed-bf16" if key == "mixed-16" else precision,
                    optimizer=optimizer,
                    batch_size=batch_size,
                    seq_len=seq_len,
                    checkpointing=checkpointing,
                    attn_implementation=attn_implementation,
                    free_outputs=free_outputs,
                    device=device,
                )
            except SimulationError as exc:
                return Simulations(reason=str(exc))
        out.steps[precision] = done[key]
    return out
