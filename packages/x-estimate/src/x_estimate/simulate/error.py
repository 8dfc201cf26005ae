"""The one error a simulated step raises: why the step cannot run on fake tensors."""

from __future__ import annotations

__all__ = ["SimulationError"]


class SimulationError(Exception):
    """The step cannot be simulated; the message names why, for the fallback note."""
