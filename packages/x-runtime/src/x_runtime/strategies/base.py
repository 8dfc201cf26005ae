"""The seam between the accelerator and a strategy: the ``Strategy`` Protocol and what it returns.

The ``Accelerator`` holds one object typed as ``Strategy`` and routes through it everything that
depends on how the model is distributed: placing and wrapping the model, the optimizer's setup
and step, backward, gradient clipping, ``no_sync``, the data loader's device, state dicts and
checkpoint files. A strategy never receives the accelerator: it gets the objects it works on
and returns what it replaced (``Replacements``), which the accelerator applies. Classes
implementing it share code through ``defaults.StrategyDefaults`` (plain PyTorch's answer to
every hook); the Protocol, not that mixin, is the contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from x_runtime.data.gradient_state import GradientState
    from x_runtime.data.loader.prepare import LoaderSpec

__all__ = ["Replacements", "Strategy"]


@dataclass(frozen=True)
class Replacements:
    """What a strategy replaced once a ``prepare`` call had everything (DeepSpeed builds its engine then).

    Args:
        models: position in the ``prepare`` call -> the object to return (and train) instead.
        optimizers: position of a prepared optimizer -> the optimizer that now steps, inside
            ``backward`` (the prepared wrapper's own ``step``/``zero_grad`` then do nothing).
        stand_ins: position of a stand-in the strategy replaced (DeepSpeed's ``DummyOptim``,
            ``DummyScheduler``) -> the prepared optimizer or scheduler to return for it.
        num_steps: gradient accumulation steps the strategy settled on, if it changed them.
    """

    models: Mapping[int, torch.nn.Module] = field(default_factory=dict)
    optimizers: Mapping[int, Any] = field(default_factory=dict)
    stand_ins: Mapping[int, Any] = field(default_factory=dict)
    num_steps: int | None = None


class Strategy(Protocol):
    """How the prepared model is distributed: the hooks the accelerator (and checkpointing) call."""

    # Read-only (a property), so a strategy fixed to one type may declare it as plain ``str``.
    @property
    def distributed_type(self) -> str | None:
        """The type this strategy runs as; None keeps what the process state inferred."""
        ...

    scales_loss_for_accumulation: bool  # True: backward divides by the accumulation steps itself
    # True: checkpoint files are written from plain host state dicts, with no collective and no
    # device work, so an asynchronous save may hand a host copy to a background thread. Sharding
    # strategies (FSDP, DeepSpeed) and XLA gather or stream their files: their saves stay synchronous.
    writes_from_state_dicts: bool

    # --- prepare -----------------------------------------------------------------------------
    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model on this process's device (or left for a later hook to place)."""
        ...

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        """The model as it trains: wrapped (DDP), sharded (FSDP) or as it is."""
        ...

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer, pointed at the parameters the model holds now."""
        ...

    def finish_prepare(self, prepared: Sequence[Any], *, accumulation_steps: int) -> Replacements:
        """Called with everything one ``prepare`` call returns, before it returns."""
        ...

    def build_loader(self, spec: LoaderSpec, device: torch.device | None, gradient_state: GradientState) -> Any:
        """The prepared loader for ``spec``, its batches on ``device`` (``None``: left where loaded)."""
        ...

    # --- the step ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler | None, **kwargs: Any) -> None: ...

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Runs just before a prepared optimizer's real step (accumulation boundaries only)."""
        ...

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Runs just after it."""
        ...

    def no_sync(self, model: torch.nn.Module) -> AbstractContextManager[None]:
        """Gradients accumulate locally inside the block (no all-reduce / reduce-scatter)."""
        ...

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor: ...

    # --- weights -----------------------------------------------------------------------------
    def to_host(self, data: Any) -> Any:
        """``data`` in a form ``torch.save`` writes (XLA tensors must leave the device first)."""
        ...

    def load_device(self, model: torch.nn.Module) -> torch.device:
        """Where saved whole-model weights are read to before they are copied into ``model``."""
        ...

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights (every rank calls this; only the main process needs them)."""
        ...

    def save_model_files(
        self, folder: Path, name: str, model: torch.nn.Module, *, writer: bool, safe_serialization: bool = True
    ) -> dict[str, Any]:
        """Write ``model``'s weights under ``folder``; return what the manifest should record.

        Every rank calls it. ``writer``: this rank assembles ``folder`` (rank 0 for a shared folder;
        each rank for a folder of its own). Strategies whose ranks hold whole replicas write the
        whole-model files when ``writer``; sharding strategies keep their own rule.
        ``safe_serialization=False``: whole-model weights go to ``pytorch_<name>.bin`` (plain tensors,
        read back with ``weights_only=True``) instead of ``<name>.safetensors``.
        """
        ...

    def load_model_files(
        self, folder: Path, name: str, model: torch.nn.Module, record: dict[str, Any], strict: bool
    ) -> None: ...

    def save_optimizer_files(
        self, folder: Path, name: str, optimizer: Any, model: Any, *, writer: bool
    ) -> dict[str, Any]: ...

    def load_optimizer_files(
        self, folder: Path, name: str, optimizer: Any, model: Any, record: dict[str, Any]
    ) -> None: ...
