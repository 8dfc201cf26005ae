"""Where a model loaded in 8-bit or 4-bit (bitsandbytes) may be trained: checked at ``prepare``.

bitsandbytes' quantized layers compute on the device they were loaded on; their weights cannot be
moved afterwards, nor computed on the CPU (unless bitsandbytes was built with its multi-backend
support) nor read from disk. transformers records where each part went in ``hf_device_map``; a
placement training cannot use is refused here in one line, naming the fix, instead of failing
inside a bitsandbytes kernel (or, in Accelerate before 1.15, with a ``TypeError``).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from x_runtime.core.imports import is_bnb_available, is_xpu_available

__all__ = ["check_quantized_placement"]


def _bnb_computes_on_cpu() -> bool:
    """bitsandbytes built with its multi-backend support runs its kernels on the CPU too."""
    if not is_bnb_available():
        return False
    bitsandbytes = importlib.import_module("bitsandbytes")  # optional: imported only when installed
    return "multi_backend" in getattr(bitsandbytes, "features", set())


def check_quantized_placement(model: torch.nn.Module, *, device: torch.device, distributed: bool) -> None:
    """Refuse an 8-bit/4-bit model placed where this process cannot train it; other models pass.

    Raises:
        ValueError: the model is spread over several devices in a distributed run, sits on
            another device than ``device``, or has parts offloaded to the CPU or disk.

    Examples:
        >>> model = torch.nn.Linear(2, 2)
        >>> model.is_loaded_in_8bit, model.hf_device_map = True, {"": "disk"}
        >>> check_quantized_placement(model, device=torch.device("cpu"), distributed=False)
        Traceback (most recent call last):
        ValueError: a model loaded in 8-bit or 4-bit precision cannot be trained with CPU or disk offload (its hf_device_map holds disk); load it on the training device, e.g. device_map={'': 0}, or install bitsandbytes with multi-backend support to train on the CPU
    """
    quantized = getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)
    device_map: dict[str, Any] = getattr(model, "hf_device_map", None) or {}
    if not quantized or not device_map:
        return
    places = set(device_map.values())
    if len(places) > 1 and distributed:
        raise ValueError(
            "a model loaded in 8-bit or 4-bit precision cannot be trained spread over several devices in a "
            f"distributed run (its hf_device_map holds {', '.join(sorted(map(str, places)))}); "
            "launch one process, or load the whole model on each process's device"
        )
    cpu_ok = _bnb_computes_on_cpu()
    if len(places) == 1 and "disk" not in places:  # disk is no torch device: refused as offload below
        (place,) = places
        index = place if isinstance(place, int) else torch.device(place).index
        here = torch.device(device.type, index)
        # A model on the first device (index 0) trains on a device given without an index, as in Accelerate.
        if not (device.type == "cpu" and cpu_ok) and here != device and (device.index is not None or index != 0):
            raise ValueError(
                f"a model loaded in 8-bit or 4-bit precision on {place} cannot be trained on {device}; "
                "load it on the training device, e.g. device_map={'': accelerator.device}"
            )
    offloaded = sorted(str(p) for p in places if p == "disk" or (p == "cpu" and (not cpu_ok or is_xpu_available())))
    if offloaded:
        raise ValueError(
            "a model loaded in 8-bit or 4-bit precision cannot be trained with CPU or disk offload (its hf_device_map "
            f"holds {', '.join(offloaded)}); load it on the training device, e.g. device_map={{'': 0}}, "
            "or install bitsandbytes with multi-backend support to train on the CPU"
        )
