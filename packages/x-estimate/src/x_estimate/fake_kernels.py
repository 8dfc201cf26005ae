"""Output shapes for ops whose fake (meta) kernel refuses what the CPU kernel runs.

``aten._grouped_mm`` (transformers' default MoE experts, ``grouped_mm``) has a meta kernel that
only accepts bfloat16, a CUDA restriction; the CPU kernel takes float32 too, so a float32
Mixtral trains on CPU and must simulate. This mode answers such ops with an empty tensor of the
right shape and dtype, which is all a fake step needs; every other op passes through.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["FakeKernels"]


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


class FakeKernels(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default:
            a, b = args[0], args[1]
            offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
            shape = list(_grouped_mm_shape(a, b))
            if shape[0] == -1:
                shape[0] = offs.shape[0] if offs is not None else 1
            dtype = kwargs.get("out_dtype") or a.dtype
            return torch.empty(shape, dtype=dtype, device=a.device)
        return func(*args, **kwargs)
