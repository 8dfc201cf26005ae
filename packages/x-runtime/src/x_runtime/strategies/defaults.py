"""Plain PyTorch's answer to every ``Strategy`` hook, for strategies to mix in and override.

One process, nothing wrapped: the model goes to the device, backward goes through the fp16
scaler when there is one, no hook runs around the optimizer step, and weights are written as
whole tensors (``model.safetensors``, ``optimizer.bin``) by the main process. DDP adds its
wrapper to this; FSDP, DeepSpeed and XLA override what they do differently.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from x_runtime.core.offloaded import state_dict_of
from x_runtime.io.files import torch_load, torch_save
from x_runtime.io.model_files import load_tensors_file, save_tensors_file
from x_runtime.strategies.base import Replacements
from x_runtime.strategies.sharded_files import load_sharded_model, load_sharded_optimizer

if TYPE_CHECKING:
    from x_runtime.data.gradient_state import GradientState
    from x_runtime.data.loader.prepare import LoaderSpec
    from x_runtime.process.topology.state import ProcessState

__all__ = ["StrategyDefaults", "check_shapes", "refuse_layout"]


class StrategyDefaults:
    """The hooks as a single plain-PyTorch process runs them; ``state`` is the process's."""

    distributed_type: str | None = None  # None keeps what the process state inferred
    scales_loss_for_accumulation = False  # True: backward divides by the accumulation steps itself
    writes_from_state_dicts = True  # whole tensors from host state dicts: async saves copy and go
    state: ProcessState

    # --- prepare -----------------------------------------------------------------------------
    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.state.device)

    def wrap_model(self, model: torch.nn.Module, *, train: bool) -> torch.nn.Module:
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def finish_prepare(self, prepared: Sequence[Any], *, accumulation_steps: int) -> Replacements:
        return Replacements()

    def build_loader(self, spec: LoaderSpec, device: torch.device | None, gradient_state: GradientState) -> Any:
        return spec.build(device=device, gradient_state=gradient_state)

    # --- the step ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler | None, **kwargs: Any) -> None:
        # torch's Tensor.backward has no annotations, which the strict modules' checks refuse to call.
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)  # type: ignore[no-untyped-call]
        else:
            loss.backward(**kwargs)  # type: ignore[no-untyped-call]

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Runs just before a prepared optimizer's real step (accumulation boundaries only)."""

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Runs just after it."""

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        yield

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # --- weights: whole tensors, written by the main process ---------------------------------
    def to_host(self, data: Any) -> Any:
        """``data`` in a form ``torch.save`` writes (XLA tensors must leave the device first)."""
        return data

    def load_device(self, model: torch.nn.Module) -> torch.device:
        """Where saved weights are read to before they are copied into ``model``."""
        return next((p.device for p in model.parameters()), torch.device("cpu"))

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights (every rank calls this; only the main process needs them)."""
        # Offloaded (meta) weights are read back from their hooks; to_host keeps the dict's shape.
        weights: dict[str, torch.Tensor] = self.to_host(state_dict_of(model))
        return weights

    def save_model_files(
        self, folder: Path, name: str, model: torch.nn.Module, *, writer: bool, safe_serialization: bool = True
    ) -> dict[str, Any]:
        """Write ``model``'s weights under ``folder`` when this rank assembles it (replicas: any rank can)."""
        file = weights_file_name(name, safe_serialization)
        if writer:
            save_full_weights(self.to_host(state_dict_of(model)), folder / file)
        return {"layout": "full", "file": file}

    def load_model_files(
        self, folder: Path, name: str, model: torch.nn.Module, record: dict[str, Any], strict: bool
    ) -> None:
        if record.get("layout") == "sharded":  # parts written by FSDP or tensor parallel ranks: DCP reads any layout
            load_sharded_model(folder / f"{name}_sharded", model, strict=strict)
            return
        refuse_layout(record, "full", folder)
        path = folder / record.get("file", weights_file_name(name, True))
        weights = load_full_weights(path, device=self.load_device(model))
        check_shapes(path, weights, model.state_dict())
        model.load_state_dict(weights, strict=strict)

    def save_optimizer_files(
        self, folder: Path, name: str, optimizer: Any, model: Any, *, writer: bool
    ) -> dict[str, Any]:
        if writer:
            torch_save(self.to_host(optimizer.state_dict()), folder / f"{name}.bin")
        return {"layout": "full"}

    def load_optimizer_files(self, folder: Path, name: str, optimizer: Any, model: Any, record: dict[str, Any]) -> None:
        if record.get("layout") == "sharded":
            load_sharded_optimizer(folder / f"{name}_sharded", optimizer, model)
            return
        refuse_layout(record, "full", folder)
        optimizer.load_state_dict(torch_load(folder / f"{name}.bin"))


def weights_file_name(name: str, safe_serialization: bool) -> str:
    """``model.safetensors``, or Accelerate's ``pytorch_model.bin`` when not ``safe_serialization``."""
    return f"{name}.safetensors" if safe_serialization else f"pytorch_{name}.bin"


def save_full_weights(weights: Mapping[str, torch.Tensor], path: Path) -> None:
    """Whole-model weights to ``path``: safetensors, or ``torch.save`` of plain tensors for ``.bin``."""
    if path.suffix == ".safetensors":
        save_tensors_file(weights, path)
    else:
        torch_save(dict(weights), path)  # torch.save keeps tied tensors shared, as safetensors' aliases do


def load_full_weights(path: Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read what ``save_full_weights`` wrote (a ``.bin`` without running pickled code)."""
    if path.suffix == ".safetensors":
        return load_tensors_file(path, device=device)
    weights: dict[str, torch.Tensor] = torch_load(path)
    return {key: value.to(device) for key, value in weights.items()}


def refuse_layout(record: Mapping[str, Any], expected: str, folder: Path) -> None:
    """Refuse a checkpoint whose manifest records another layout than ``expected``."""
    layout = record.get("layout", "full")
    if layout != expected:
        raise ValueError(
            f"{folder} holds {layout} ({record.get('strategy', 'another strategy')}) weights but this run reads "
            f"{expected} ones; resume with the strategy that saved it"
        )


def check_shapes(path: Path, saved: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Refuse saved tensors whose shapes differ from the model's, naming each."""
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
