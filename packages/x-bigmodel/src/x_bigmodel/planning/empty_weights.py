"""Build a model skeleton without paying for its weights: parameters land on ``meta`` (or any device).

``init_empty_weights`` patches ``torch.nn.Module.register_parameter`` (and ``register_buffer``
when asked) for the duration of a ``with`` block, as Accelerate does, so every parameter is
moved to the target device the moment a module registers it. Initialisers that run later in
``__init__`` (``reset_parameters``) then touch meta tensors and cost nothing.

Accelerate lets ``torch.empty`` allocate each weight on the CPU before it is moved, which
fails outright for a weight larger than RAM where the kernel does not overcommit. Here
``torch.empty`` calls without an explicit device are sent to the target device too (its values
are undefined anyway, so nothing is lost). Such a tensor registered as a buffer while buffers
stay put is recreated, uninitialised as it was, on the default device; the one case this gets
wrong is a buffer made with ``torch.empty`` and filled *before* it is registered: build such
modules with ``include_buffers=True``, or fill after registering.

Differences from Accelerate:

* a parameter that already lives on the target device is kept as the same object, so weights
  tied inside ``__init__`` (``self.head.weight = self.emb.weight``) stay tied;
* nested blocks call the unpatched registration once, so an outer ``init_on_device("cuda")``
  never copies to the GPU what an inner ``init_empty_weights()`` will put on meta;
* with ``include_buffers=True`` tensor constructors default to the device too (through
  ``torch.device`` as a context manager), so buffers are created there directly.

The patch is process-wide while active (like Accelerate's): do not build other models in
other threads meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["init_empty_weights", "init_on_device"]

# Marks our wrappers so nested blocks find the real registration function underneath.
_BASE_ATTR = "_x_bigmodel_unpatched"
_DEFAULT_ATTR = "_x_bigmodel_outer_default_device"


_PLACEHOLDER_ATTR = "_x_bigmodel_placeholder"


class _EmptyOnDevice(TorchFunctionMode):
    """Send ``torch.empty`` calls that name no device to ``device``: their values are undefined anyway."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.empty and kwargs.get("device") is None:
            kwargs["device"] = self.device
            tensor = func(*args, **kwargs)
            setattr(tensor, _PLACEHOLDER_ATTR, True)
            return tensor
        return func(*args, **kwargs)


def _unpatched(fn: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(fn, _BASE_ATTR, fn)


def _on(tensor: torch.Tensor, device: torch.device) -> bool:
    # "cuda" (no index) means the current device: a tensor on any CUDA device is already there.
    return tensor.device.type == device.type and (device.index is None or tensor.device.index == device.index)


def _moved_parameter(param: torch.nn.Parameter, device: torch.device) -> torch.nn.Parameter:
    if _on(param, device):
        return param
    param_cls = type(param)
    # Subclasses (quantised parameter types) keep their extra state in __dict__ and take it back
    # as constructor keywords, which is how Accelerate rebuilds them; plain Parameters have none.
    kwargs = dict(param.__dict__)
    kwargs["requires_grad"] = param.requires_grad
    try:
        return param_cls(param.to(device), **kwargs)
    except TypeError:
        new = param_cls(param.to(device), param.requires_grad)
        new.__dict__.update(param.__dict__)
        return new


@contextlib.contextmanager
def init_on_device(device: torch.device | str | int, include_buffers: bool = False) -> Iterator[None]:
    """Create every parameter (and buffer, if asked) of modules built inside the block on ``device``.

    Args:
        device: where parameters go, e.g. ``"meta"``, ``"cuda:0"``, ``0``.
        include_buffers: also put buffers there; tensor constructors called inside the block
            then default to ``device`` as well.

    The previous state is restored on exit, also when the block raises; blocks nest and the
    innermost one wins.

    Examples:
        >>> import torch
        >>> with init_on_device("meta"):
        ...     layer = torch.nn.Linear(4, 4)
        >>> layer.weight.device.type
        'meta'
    """
    target = torch.device(device)
    previous_register_parameter = torch.nn.Module.register_parameter
    previous_register_buffer = torch.nn.Module.register_buffer
    base_register_parameter = _unpatched(previous_register_parameter)
    base_register_buffer = _unpatched(previous_register_buffer)

    # The first argument is named self, as in torch.nn.Module's methods these replace.
    def register_parameter(self: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        base_register_parameter(self, name, param)
        # Read back what was registered: a global registration hook may have replaced ``param``.
        if param is not None and (registered := self._parameters[name]) is not None:
            self._parameters[name] = _moved_parameter(registered, target)

    def register_buffer(self: torch.nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        base_register_buffer(self, name, tensor, persistent=persistent)
        if tensor is not None and (buffer := self._buffers[name]) is not None and not _on(buffer, target):
            self._buffers[name] = buffer.to(target)

    setattr(register_parameter, _BASE_ATTR, base_register_parameter)
    setattr(register_buffer, _BASE_ATTR, base_register_buffer)
    # The default device outside every block, for an inner block that keeps buffers where they are.
    outer_default = getattr(previous_register_buffer, _DEFAULT_ATTR, None) or torch.get_default_device()
    setattr(register_buffer, _DEFAULT_ATTR, outer_default)

    with contextlib.ExitStack() as stack:
        torch.nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
        stack.callback(setattr, torch.nn.Module, "register_parameter", previous_register_parameter)
        if include_buffers:
            torch.nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]
            stack.callback(setattr, torch.nn.Module, "register_buffer", previous_register_buffer)
            stack.enter_context(target)
        else:
            keep_device = torch.device(outer_default)

            def register_buffer_in_place(
                self: torch.nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
            ) -> None:
                if tensor is not None and getattr(tensor, _PLACEHOLDER_ATTR, False):
                    tensor = torch.empty(tensor.shape, dtype=tensor.dtype, device=keep_device)
                base_register_buffer(self, name, tensor, persistent=persistent)

            setattr(register_buffer_in_place, _BASE_ATTR, base_register_buffer)
            setattr(register_buffer_in_place, _DEFAULT_ATTR, outer_default)
            torch.nn.Module.register_buffer = register_buffer_in_place  # type: ignore[method-assign]
            stack.callback(setattr, torch.nn.Module, "register_buffer", previous_register_buffer)
            if previous_register_buffer is not _unpatched(previous_register_buffer):
                # An outer block put buffers on its device; this inner block asked for them to stay
                # where they are created, and the innermost block wins.
                stack.enter_context(keep_device)
            stack.enter_context(_EmptyOnDevice(target))
        yield


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build models whose parameters (and buffers, if asked) are on the meta device: no memory used.

    Use it to get a skeleton whose sizes can be measured and whose weights are loaded later,
    straight to their devices.

    Args:
        include_buffers: also put buffers on meta. Off by default: buffers are small and often
            computed in ``__init__`` (rotary tables, position ids) rather than stored in checkpoints.

    Examples:
        >>> import torch
        >>> with init_empty_weights():
        ...     model = torch.nn.Sequential(*[torch.nn.Linear(100_000, 100_000) for _ in range(10)])
        >>> all(p.is_meta for p in model.parameters())
        True
    """
    with init_on_device("meta", include_buffers=include_buffers):
        yield
