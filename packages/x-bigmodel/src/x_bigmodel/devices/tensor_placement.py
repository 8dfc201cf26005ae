"""Putting one tensor into a module: on a device, in a dtype, keeping the Parameter class, ties
and ``requires_grad``; and giving a copied tensor's file pages back to the kernel.
"""

from __future__ import annotations

import mmap
import sys

import torch
from torch import nn

from x_bigmodel.devices.pages import advise


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put parameter or buffer ``tensor_name`` of ``module`` on ``device``, optionally with a new value.

    The slot is replaced (not copied into), so this works on meta tensors. A parameter stays an
    instance of its class with its ``requires_grad``. Only the named slot changes: for tied weights,
    assign every alias (``load_checkpoint_in_model`` does).

    Args:
        module: the root module.
        tensor_name: dotted name, as in ``module.state_dict()``, e.g. ``"layers.0.weight"``.
        device: target device (``"cpu"``, ``"cuda:0"``, an int GPU id, ``torch.device``).
        value: the new value; its shape must match the current tensor's. Without it the current
            tensor moves, which a meta tensor cannot.
        dtype: cast floating values to this dtype. Default: a floating value takes the current
            tensor's dtype when that is floating; integer and bool values keep theirs.
        non_blocking: an asynchronous copy to the device (from pinned memory), as ``Tensor.to`` takes it.
        clear_cache: accepted for Accelerate's signature (diffusers passes it); x never empties the
            device's cache here.

    Raises:
        AttributeError: the module has no such parameter or buffer.
        ValueError: the shapes differ, or a meta tensor would be moved without a value.

    Examples:
        >>> with torch.device("meta"):
        ...     layer = nn.Linear(2, 3)
        >>> set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(3, 2))
        >>> layer.weight.device.type, type(layer.weight).__name__, layer.weight.requires_grad
        ('cpu', 'Parameter', True)
    """
    owner, leaf = owner_of(module, tensor_name)
    old = _current(owner, leaf, tensor_name)
    target_device = as_device(device)
    if value is None:
        if old.device.type == "meta" and target_device.type != "meta":
            raise ValueError(f"{tensor_name} is on the meta device and has no data: pass value= to materialise it")
        value = old.detach()
    elif tuple(value.shape) != tuple(old.shape):
        # Accelerate's words, which code written against it matches on.
        raise ValueError(
            f'Trying to set a tensor of shape {value.shape} in "{leaf}" (which has shape {old.shape}), '
            "this looks incorrect."
        )
    target_dtype = placement_dtype(value, old, torch_dtype(dtype) if dtype is not None else None)
    new = value.detach().to(device=target_device, dtype=target_dtype, non_blocking=non_blocking)
    assign_tensor(owner, leaf, wrap_like(old, new))


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``torch.float16`` from ``"float16"``, ``"torch.float16"``, ``"fp16"`` or ``torch.float16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    from x_common.dtypes import dtype_name

    result = getattr(torch, dtype_name(dtype), None)
    if not isinstance(result, torch.dtype):
        raise ValueError(f"{dtype!r} is not a torch dtype")
    return result


def as_device(device: int | str | torch.device) -> torch.device:
    if isinstance(device, int):
        # current_accelerator() is a torch.device (None on a CPU-only build), and torch.device()
        # takes a type string beside an index, not a device.
        accelerator = torch.accelerator.current_accelerator()
        return torch.device(accelerator.type if accelerator is not None else "cuda", device)
    return torch.device(device)


def release_pages(source: torch.Tensor, copy: torch.Tensor) -> None:
    """Drop the file pages behind ``source`` from this process once they are copied.

    While a safetensors file is open, every page read stays mapped (and counted in RSS), so
    loading a 5 GB shard costs 5 GB beside the model. Advising the kernel that the pages are no
    longer needed keeps the peak at the model plus one tensor. The pages are clean (read-only
    use), so the kernel re-reads them from the file should anything touch them again.
    """
    if not sys.platform.startswith("linux") or source.device.type != "cpu" or source.numel() == 0:
        return
    if copy.device.type == "cpu" and copy.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
        return  # never advise away memory the model now uses
    advise(source.data_ptr(), source.nbytes, mmap.MADV_DONTNEED)


def owner_of(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    prefix, _, leaf = tensor_name.rpartition(".")
    try:
        return (module.get_submodule(prefix) if prefix else module), leaf
    except AttributeError as exc:
        raise AttributeError(f"{type(module).__name__} has no module {prefix!r} (for {tensor_name})") from exc


def _current(owner: nn.Module, leaf: str, tensor_name: str) -> torch.Tensor:
    if leaf in owner._parameters and owner._parameters[leaf] is not None:
        return owner._parameters[leaf]  # type: ignore[return-value]
    if leaf in owner._buffers and owner._buffers[leaf] is not None:
        return owner._buffers[leaf]  # type: ignore[return-value]
    raise AttributeError(f"{type(owner).__name__} has no parameter or buffer {leaf!r} (for {tensor_name})")


def wrap_like(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    if not isinstance(old, nn.Parameter):
        return new
    grad = old.requires_grad and (new.is_floating_point() or new.is_complex())
    param = type(old)(new, requires_grad=grad)
    # Keep attributes callers hang on parameters (e.g. sharding or init markers).
    for key, value in vars(old).items():
        if key not in vars(param):
            setattr(param, key, value)
    return param


def assign_tensor(owner: nn.Module, leaf: str, new: torch.Tensor) -> None:
    if leaf in owner._parameters:
        owner._parameters[leaf] = new  # type: ignore[assignment]
    else:
        owner._buffers[leaf] = new


def assign_aliases(model: nn.Module, names: list[str], new: torch.Tensor) -> None:
    for name in names:
        owner, leaf = owner_of(model, name)
        assign_tensor(owner, leaf, new)


def _in_fp32_module(name: str, fp32_modules: list[tuple[str, ...]]) -> bool:
    parts = tuple(name.split("."))
    return any(parts[i : i + len(m)] == m for m in fp32_modules for i in range(len(parts) - len(m) + 1))


def placement_dtype(
    value: torch.Tensor,
    current: torch.Tensor,
    dtype: torch.dtype | None,
    name: str = "",
    fp32_modules: list[tuple[str, ...]] | None = None,
) -> torch.dtype:
    if not value.is_floating_point():
        return value.dtype
    if fp32_modules and _in_fp32_module(name, fp32_modules):
        return torch.float32
    if dtype is not None:
        return dtype
    return current.dtype if current.is_floating_point() else value.dtype
