"""What one accelerator saves and restores: ``CheckpointParts``, and the manifest's name.

Its own module so that both readers (``checkpointing`` for x's folders, ``accelerate_layout``
for folders Accelerate wrote) take the same object without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from x_runtime.strategies.base import Strategy

__all__ = ["MANIFEST", "CheckpointParts", "numbered"]

MANIFEST = "x_checkpoint.json"  # written last: a folder holding it is a complete x checkpoint


@dataclass
class CheckpointParts:
    """The objects one accelerator saves and restores, in ``prepare`` order per kind."""

    models: list[torch.nn.Module] = field(default_factory=list)  # unwrapped
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)
    scaler: torch.amp.GradScaler | None = None
    # Writes and reads the model and optimizer files; required (keyword-only, after the defaulted lists).
    strategy: Strategy = field(kw_only=True)
    # Given the folder being written (read), before any file: the models whose files to write (read).
    before_save: Callable[[Path], list[torch.nn.Module]] | None = field(default=None, kw_only=True)
    before_load: Callable[[Path], list[torch.nn.Module]] | None = field(default=None, kw_only=True)
    # The accelerator's step: saved for Accelerate's load_state (in random_states_<rank>.pkl), and set by
    # loading a folder that records it (Accelerate's; x's own load leaves the step as it is).
    step: int | None = field(default=None, kw_only=True)
    # This rank's generators as captured when an asynchronous save began (None: capture when writing).
    random_state: dict[str, Any] | None = field(default=None, kw_only=True)

    def owner(self, optimizer: Any) -> torch.nn.Module | None:
        """The model whose parameters ``optimizer`` updates (sharded strategies need the pair)."""
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return next((m for m in self.models if any(id(p) in params for p in m.parameters())), None)


def numbered(stem: str, index: int, suffix: str) -> str:
    """``model.safetensors``, ``model_1.safetensors``, ...: the first object's file has no number."""
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"
