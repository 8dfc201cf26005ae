"""Mixed precision: which autocast dtype, the fp16 grad scaler, and the autocasting forward.

The prepared model's ``forward`` runs under autocast and returns float32 outputs, so losses and
metrics computed after it keep full precision, as in Accelerate. fp16 needs a loss scaler and a
GPU; on CPU it is accepted and, exactly as Accelerate 1.15 does there, computes in float32 with
no autocast and no scaler (bf16 is the CPU choice that autocasts). fp8 is checked and applied by
``precision.fp8``; around its fp8 layers the model autocasts to bf16.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import torch

from x_common.env import MIXED_PRECISIONS
from x_runtime.core import nested

__all__ = ["Precision", "convert_outputs_to_fp32", "convert_to_fp32", "unwrap_forward"]

# fp8 converts Linear layers (precision.fp8, after its hardware check); the rest runs in bf16.
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


class Precision:
    """The mixed-precision policy of one accelerator on one device."""

    def __init__(
        self,
        mode: str | None,
        device: torch.device,
        *,
        autocast_kwargs: dict[str, Any] | None = None,
        scaler_kwargs: dict[str, Any] | None = None,
        native: bool = True,
    ):
        mode = "no" if mode in (None, "") else str(mode).lower()
        if mode not in MIXED_PRECISIONS:
            raise ValueError(f"mixed_precision={mode!r} is not one of {', '.join(MIXED_PRECISIONS)}")
        if mode in ("fp16", "fp8") and device.type == "xla":
            raise ValueError(f"mixed_precision={mode!r} on an XLA device: TPUs compute in bf16; use 'bf16' or 'no'")
        if mode == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(
                f"mixed_precision='bf16' is not supported by {torch.cuda.get_device_name(device)}; use 'fp16'"
            )
        self.mode = mode
        self.device = device
        # fp16 on CPU: Accelerate keeps native_amp off there (no autocast, no GradScaler). Same
        # here, but said once: Accelerate trains in fp32 without a word. Not native: the strategy
        # runs mixed precision itself (DeepSpeed's engine casts the model and scales the loss), as
        # Accelerate leaves it there: no autocast, no GradScaler beside it.
        fp16_on_cpu = mode == "fp16" and device.type == "cpu"
        self.dtype = _DTYPES.get(mode) if native and not fp16_on_cpu else None
        if fp16_on_cpu and native:
            warnings.warn(
                "mixed_precision='fp16' on CPU computes in float32, as Accelerate does there (no autocast, "
                "no loss scaling); mixed_precision='bf16' is the CPU choice that autocasts",
                stacklevel=3,
            )
        self._autocast_kwargs = dict(autocast_kwargs or {})
        self._autocast_kwargs.pop("enabled", None)
        self.autocast_enabled = (autocast_kwargs or {}).get("enabled", True)
        self.scaler: torch.amp.GradScaler | None = None
        if mode == "fp16" and not fp16_on_cpu and native:
            self.scaler = torch.amp.GradScaler(device.type, **(scaler_kwargs or {}))

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self, *, enabled: bool | None = None, **overrides: Any) -> contextlib.AbstractContextManager[Any]:
        """Autocast context for this policy (a no-op when mixed precision is off)."""
        on = self.enabled and (self.autocast_enabled if enabled is None else enabled)
        if not on:
            return contextlib.nullcontext()
        kwargs = {**self._autocast_kwargs, **overrides}
        if kwargs.get("cache_enabled") is None:
            kwargs.pop("cache_enabled", None)
        return torch.autocast(device_type=self.device.type, dtype=self.dtype, **kwargs)

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Make ``model.forward`` autocast and return fp32 outputs; idempotent."""
        if not self.enabled or getattr(model, "_x_original_forward", None) is not None:
            return
        original = model.forward
        policy = self

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            with policy.autocast():
                output = original(*args, **kwargs)
            return convert_to_fp32(output)

        model._x_original_forward = original  # type: ignore[assignment]
        model.forward = forward


def unwrap_forward(model: torch.nn.Module) -> None:
    """Undo ``Precision.wrap_forward``, and a conversion whose forward before it is ``model._original_forward``.

    ``_original_forward`` is Accelerate's (and transformers') convention for a forward wrapped by
    hand (with :func:`convert_outputs_to_fp32`, say): ``extract_model_from_parallel(...,
    keep_fp32_wrapper=False)`` puts it back.
    """
    for marker in ("_x_original_forward", "_original_forward"):
        original: Callable[..., Any] | None = model.__dict__.pop(marker, None)
        if original is None:
            continue
        if getattr(original, "__self__", None) is model and original.__func__ is type(model).forward:  # type: ignore[attr-defined]
            model.__dict__.pop("forward", None)
        else:
            model.forward = original


class _Fp32Outputs:
    """``forward`` whose float16/bfloat16 outputs come back as float32 (see :func:`convert_outputs_to_fp32`)."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward
        functools.update_wrapper(self, forward)  # __wrapped__: the forward it converts

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.forward(*args, **kwargs))

    def __reduce__(self) -> Any:
        raise pickle.PicklingError(
            "cannot pickle a model whose forward converts its outputs to float32 (mixed precision): unwrap it "
            "first with accelerator.unwrap_model(model) or extract_model_from_parallel(model, keep_fp32_wrapper=False)"
        )


def convert_outputs_to_fp32(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` returning its float16/bfloat16 tensors as float32, other outputs unchanged.

    Pickling it is refused with a message saying how to unwrap the model first.

    Examples:
        >>> convert_outputs_to_fp32(lambda: {"loss": torch.ones(1, dtype=torch.float16)})()["loss"].dtype
        torch.float32
    """
    return _Fp32Outputs(forward)


def convert_to_fp32(data: Any) -> Any:
    """Half-precision floating tensors inside ``data`` as float32; others unchanged."""

    def upcast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor

    return nested.apply(upcast, data)
