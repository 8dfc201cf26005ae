"""Accelerate's ``load_state_dict``: one checkpoint file read into a state dict, each tensor on the
device ``device_map`` gives it."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from x_bigmodel.devices.device_keys import storage_device
from x_bigmodel.files.checkpoint_files import open_checkpoint
from x_bigmodel.planning.device_plan import DeviceMap, DevicePlan

__all__ = ["load_state_dict"]


def load_state_dict(
    checkpoint_file: str | os.PathLike[str], device_map: DeviceMap | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors or torch checkpoint file, each in memory of its own.

    Args:
        checkpoint_file: a ``.safetensors`` file, or a ``torch.save`` file of a state dict (read
            with ``weights_only=True``).
        device_map: ``{module or tensor name: device}``; each tensor goes to the device of its
            longest matching entry (``"disk"`` and ``"cpu"``: the CPU). Default: all on the CPU.

    Raises:
        ValueError: the file cannot be read, or a tensor has no entry in ``device_map``.
    """
    plan = DevicePlan.from_map(device_map) if device_map is not None else None
    result: dict[str, torch.Tensor] = {}
    with open_checkpoint(Path(checkpoint_file)) as reader:
        names = reader.keys()  # a CheckpointReader is not iterable
        for key in names:
            device = storage_device(plan.device_for(key)) if plan is not None else torch.device("cpu")
            result[key] = reader.load(key, device, reader.torch_dtype(key))
    return result
