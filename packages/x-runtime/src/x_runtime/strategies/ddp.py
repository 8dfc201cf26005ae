"""The default strategy: one process, or DistributedDataParallel over a process group.

Every other strategy subclasses ``DDPStrategy`` and overrides what it does differently, so the
accelerator calls the same methods whatever runs underneath.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from x_runtime.checkpointing import torch_load, torch_save
from x_runtime.model_files import load_tensors_file, save_tensors_file
from x_runtime.state import ProcessState

__all__ = ["DDPStrategy", "check_shapes"]


class DDPStrategy:
    """Plain PyTorch: the model as it is, wrapped in DDP when several processes train it."""

    distributed_type: str | None = None  # None keeps what the process state inferred
    scales_loss_for_accumulation = False  # True: backward divides by the accumulation steps itself

    def __init__(self, state: ProcessState, *, ddp_kwargs: dict[str, Any] | None = None):
        self.state = state
        self.ddp_kwargs = dict(ddp_kwargs or {})

    # --- prepare -----------------------------------------------------------------------------
    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.state.device)

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        if not (train and self.state.use_distributed and any(p.requires_grad for p in model.parameters())):
            return model
        device = self.state.device
        device_ids = [device.index] if device.type in ("cuda", "xpu") else None
        return DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def finish_prepare(self, result: list[Any], accelerator: Any) -> list[Any]:
        """Called with everything one ``prepare`` call returns, before it returns."""
        return result

    def build_loader(self, build: Any, device: torch.device | None, gradient_state: Any) -> Any:
        """The prepared loader: ``build(device=..., gradient_state=...)`` makes the sharded one."""
        return build(device=device, gradient_state=gradient_state)

    # --- the step ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler | None, **kwargs: Any) -> None:
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Runs just before a prepared optimizer's real step (accumulation boundaries only)."""

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Runs just after it."""

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        context = model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()
        with context:
            yield

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # --- weights -----------------------------------------------------------------------------
    def to_host(self, data: Any) -> Any:
        """``data`` in a form ``torch.save`` writes (XLA tensors must leave the device first)."""
        return data

    def load_device(self, model: torch.nn.Module) -> torch.device:
        """Where saved weights are read to before they are copied into ``model``."""
        return next((p.device for p in model.parameters()), torch.device("cpu"))

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights (every rank calls this; only the main process needs them)."""
        return self.to_host(model.state_dict())

    def save_model_files(self, folder: Path, name: str, model: torch.nn.Module) -> dict[str, Any]:
        """Write ``model``'s weights under ``folder``; return what the manifest should record."""
        if self.state.is_main_process:
            save_tensors_file(self.to_host(model.state_dict()), folder / f"{name}.safetensors")
        return {"layout": "full"}

    def load_model_files(self, folder: Path, name: str, model: torch.nn.Module, record: dict, strict: bool) -> None:
        _refuse_layout(record, "full", folder)
        path = folder / f"{name}.safetensors"
        weights = load_tensors_file(path, device=self.load_device(model))
        check_shapes(path, weights, model.state_dict())
        model.load_state_dict(weights, strict=strict)

    def save_optimizer_files(self, folder: Path, name: str, optimizer: Any, model: Any) -> dict[str, Any]:
        if self.state.is_main_process:
            torch_save(self.to_host(optimizer.state_dict()), folder / f"{name}.bin")
        return {"layout": "full"}

    def load_optimizer_files(self, folder: Path, name: str, optimizer: Any, model: Any, record: dict) -> None:
        _refuse_layout(record, "full", folder)
        optimizer.load_state_dict(torch_load(folder / f"{name}.bin"))


def _refuse_layout(record: dict, expected: str, folder: Path) -> None:
    layout = record.get("layout", "full")
    if layout != expected:
        raise ValueError(
            f"{folder} holds {layout} ({record.get('strategy', 'another strategy')}) weights but this run reads "
            f"{expected} ones; resume with the strategy that saved it"
        )


def check_shapes(path: Path, saved: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    wrong = [
        f"{name} {list(value.shape)} (model: {list(expected[name].shape)})"
        for name, value in saved.items()
        if name in expected and tuple(value.shape) != tuple(expected[name].shape)
    ]
    if wrong:
        raise ValueError(
            f"{path} holds tensors of other shapes than the model's: {', '.join(wrong)}; prepare the same model "
            "as the run that saved it"
        )
