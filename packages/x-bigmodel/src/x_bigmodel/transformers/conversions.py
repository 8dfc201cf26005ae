"""Tensors that transformers 5 converts at load time (fused MoE experts...), placed as the plan says.

A converted tensor is not in any file, so it cannot be read in place: it is built by transformers'
own ``WeightConverter`` from the checkpoint tensors it names, then put on its planned device, or,
when planned for disk, saved once into the offload folder (the only weights from_pretrained
writes).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from x_bigmodel.devices.device_keys import storage_device
from x_bigmodel.devices.tensor_placement import set_module_tensor_to_device
from x_bigmodel.files.checkpoint_files import open_checkpoint
from x_bigmodel.offload.weights import write_offload_files
from x_bigmodel.planning.device_plan import DevicePlan
from x_bigmodel.transformers.key_mapping import KeyMapping

__all__ = ["load_converted"]


def load_converted(
    model: nn.Module,
    mapping: KeyMapping,
    key_files: Mapping[str, Path],
    plan: DevicePlan,
    dtype: torch.dtype | None,
) -> dict[str, dict[str, Any]]:
    """Build each converted tensor and place it; returns the offload index entries of the disk ones.

    Raises:
        ValueError: a converted tensor is planned for disk but the plan has no offload folder.
    """
    expected = model.state_dict(keep_vars=True)
    index: dict[str, dict[str, Any]] = {}
    for target, (converter, sources) in mapping.conversions.items():
        for pattern, key in sources:
            converter.add_tensor(target, key, pattern, _reader_of(key_files[key], key))
        converted = converter.convert(target, model=model, config=getattr(model, "config", None))
        on_disk = {}
        for name, value in converted.items():
            value = value[0] if isinstance(value, list) else value
            current = expected[name]
            value = value.to(dtype if dtype is not None and value.is_floating_point() else current.dtype)
            device = plan.device_for(name)
            if device == "disk":
                on_disk[name] = value
            else:
                set_module_tensor_to_device(model, name, storage_device(device), value=value)
        if on_disk:
            if plan.offload_folder is None:
                raise ValueError(
                    f"{', '.join(on_disk)} is converted at load time (fused from several checkpoint tensors) "
                    "and planned for disk: pass offload_folder= to save it there"
                )
            index.update(write_offload_files(on_disk, plan.offload_folder, f"converted-{target}"))
    return index


def _reader_of(path: Path, key: str):
    def read() -> torch.Tensor:
        with open_checkpoint(path) as reader:
            return reader.get(key)  # its own memory, not the file's: it outlives the reader

    return read
