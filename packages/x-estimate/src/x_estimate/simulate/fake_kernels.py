"""Outputs for ops whose fake (meta) kernel differs from what the CPU kernel returns.

``aten._grouped_mm`` (transformers' default MoE experts, ``grouped_mm``) has a meta kernel that
only accepts bfloat16, a CUDA restriction; the CPU kernel takes float32 too, so a float32
Mixtral trains on CPU and must simulate. This mode answers it with an empty tensor of the
right shape and dtype, which is all a fake step needs.

Layer, group and batch norm on a 16-bit input with float32 weights (mixed precision: autocast
leaves the norms' weights in float32) keep their saved mean and inverse standard deviation in
float32 on the CPU (``param_scalar_type`` in ``layer_norm.cpp`` / ``group_norm.cpp``,
``batch_norm.cpp``), where the meta kernels return them in the input's dtype: half the bytes,
held from the forward to the backward (a ConvNeXt's 56 x 56 layer norms: 98 KiB each at batch
8). They are answered in float32. Every other op passes through.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["FakeKernels"]

_LOW = (torch.bfloat16, torch.float16)
_aten = torch.ops.aten
# norm -> the positions of its weight and bias among the arguments
_NORMS = {
    _aten.native_layer_norm.default: (2, 3),
    _aten.native_group_norm.default: (1, 2),
    _aten.native_batch_norm.default: (1, 2),
}


def _grouped_mm_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    # 2D x 3D: rows grouped by offsets -> (rows, N); 3D x 2D: (groups, M, N) from the weight grads;
    # 2D x 2D: the groups split K -> (groups, M, N); 3D x 3D: a batched matmul.
    if a.dim() == 2 and b.dim() == 3:
        return (a.shape[0], b.shape[-1])
    if a.dim() == 3 and b.dim() == 2:
        return (a.shape[0], a.shape[1], b.shape[-1])
    if a.dim() == 2 and b.dim() == 2:
        return (-1, a.shape[0], b.shape[-1])
    return (a.shape[0], a.shape[1], b.shape[-1])


def _mixed(args: Any, params: tuple[int, ...]) -> bool:
    """PyTorch's ``is_mixed_type``: a 16-bit input with float32 weight and bias (those given)."""
    given = [args[i] for i in params if i < len(args) and isinstance(args[i], torch.Tensor)]
    return args[0].dtype in _LOW and bool(given) and all(t.dtype == torch.float32 for t in given)


class FakeKernels(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is _aten._grouped_mm.default:
            a, b = args[0], args[1]
            offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
            shape = list(_grouped_mm_shape(a, b))
            if shape[0] == -1:
                shape[0] = offs.shape[0] if offs is not None else 1
            dtype = kwargs.get("out_dtype") or a.dtype
            return torch.empty(shape, dtype=dtype, device=a.device)
        out = func(*args, **kwargs)
        if func in _NORMS and _mixed(args, _NORMS[func]):
            out = list(out)
            for i in (1, 2):  # the saved statistics
                if out[i].dtype in _LOW:
                    out[i] = torch.empty(out[i].shape, dtype=torch.float32, device=out[i].device)
            out = tuple(out)
        return out
