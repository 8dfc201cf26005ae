"""``cpu_offload`` and ``disk_offload``: a whole model's weights in RAM or on disk, brought to the
execution device one unit at a time, with Accelerate's names and arguments.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from x_bigmodel.devices.tensor_placement import as_device
from x_bigmodel.dispatch.planned import dispatch_planned
from x_bigmodel.dispatch.tensor_sources import named_tensors
from x_bigmodel.planning.device_plan import check_device_map
from x_bigmodel.planning.model_units import model_units

__all__ = ["cpu_offload", "default_accelerator", "disk_offload"]


def cpu_offload(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload_buffers: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    prefetch: bool = True,
) -> nn.Module:
    """Keep the whole model's weights in RAM and run each unit on ``execution_device``, bringing
    its weights there for its forward (the next unit's are copied meanwhile).

    ``execution_device`` defaults to the first accelerator here (CPU when there is none, which
    makes this a no-op beyond the hooks). Accelerate defaults to the device of the model's first
    parameter instead, which for a model on the CPU means offloading nothing.
    """
    return _offload_whole(
        model,
        "cpu",
        execution_device,
        preload_module_classes,
        state_dict=state_dict,
        offload_buffers=offload_buffers,
        prefetch=prefetch,
    )


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: int | str | torch.device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: Iterable[str] | None = None,
    prefetch: bool = True,
) -> nn.Module:
    """Keep the whole model's weights on disk, in ``offload_dir``, and run each unit on
    ``execution_device`` (default: the first accelerator here, else the CPU).

    When ``offload_dir`` holds an ``index.json`` it is taken to hold the model's weights (as
    Accelerate does); otherwise the weights are saved there as safetensors, then dropped from RAM.
    """
    return _offload_whole(
        model,
        "disk",
        execution_device,
        preload_module_classes,
        offload_dir=offload_dir,
        offload_buffers=offload_buffers,
        prefetch=prefetch,
    )


def _offload_whole(
    model: nn.Module,
    where: str,
    execution_device: int | str | torch.device | None,
    preload_module_classes: Iterable[str] | None,
    offload_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> nn.Module:
    # Every unit (no-split/preload class module, leaf, or tensor of a split module) gets its own
    # entry, so a forward holds one unit's weights at a time.
    classes = set(getattr(model, "_no_split_modules", None) or ()) | set(preload_module_classes or ())
    device = as_device(execution_device) if execution_device is not None else default_accelerator()
    device_map = {unit.name: where for unit in model_units(model, classes)}
    for name, _ in named_tensors(model):  # a module registered under a second name (self.b = self.a)
        if not any(name == k or name.startswith(f"{k}.") or k == "" for k in device_map):
            device_map[name.rpartition(".")[0]] = where
    plan = check_device_map(model, device_map, offload_dir)
    return dispatch_planned(
        model,
        plan,
        main_device=device,
        preload_module_classes=preload_module_classes,
        force_hooks=True,
        **options,
    )


def default_accelerator() -> torch.device:
    """Where offloaded weights run when no execution device is given: the first accelerator, else the CPU."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return torch.device(accelerator.type, 0) if accelerator is not None else torch.device("cpu")
