"""The kernels a CUDA step would run, for a simulation whose fake tensors live on the CPU.

Fake tensors can carry ``device="cuda"`` on a CPU-only torch, but autograd cannot: recording
a backward edge for a CUDA tensor asks for the CUDA device guard, which a CPU-only build lacks
and which aborts the process (checked with torch 2.13). So a ``--device cuda`` simulation keeps
its fake tensors on the CPU and this mode swaps, at the Python level where the choice is made,
the two ops whose CPU and CUDA kernels hold different memory:

- ``scaled_dot_product_attention``: torch picks, for CUDA, flash attention, then the
  memory-efficient kernel, then the math path, by the rules of ``sdp_utils.cpp`` (``pick``
  below): flash needs fp16/bf16, no explicit mask, a head size of at most 256 and a multiple of
  8; the memory-efficient kernel takes fp32 too and a mask, but not ``enable_gqa``. Flash and
  memory-efficient keep O(S) for backward (output and log-sum-exp); the math path keeps the
  S x S weights. The CPU's own choice differs (its flash kernel takes fp32 and GQA, not dropout).
- ``dropout``: CUDA runs ``native_dropout``, which keeps a one-byte mask for backward; the CPU
  keeps a noise tensor of the input's dtype (four times the bytes in fp32).

- autocast: the step runs under CPU autocast (the tensors are CPU tensors), whose op lists
  differ from CUDA's; the ops CUDA autocast runs in float32 and the CPU's does not (``pow``,
  ``exp``, ``rsqrt``, ``layer_norm``, ``softmax``, ``sum``, ... from ``autocast_mode.cpp``) get
  their 16-bit inputs cast up here, and SDPA's inputs are cast down, as CUDA autocast casts them.

Kernels chosen at runtime inside a CUDA op (cuBLAS workspaces, flash backward's fp32
accumulators) are not ops and are added by the simulation itself (``cuda_memory.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["CudaKernels", "pick"]

_SDPA = torch.nn.functional.scaled_dot_product_attention
# CUDA autocast's float32 list (the ops it casts up), less those CPU autocast casts too.
_FP32 = frozenset(
    [
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow",
        "rpow",
        "softplus",
        "layer_norm",
        "group_norm",
        "cosine_similarity",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "margin_ranking_loss",
        "multilabel_margin_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "binary_cross_entropy_with_logits",
        "dist",
        "pdist",
        "renorm",
        "logsumexp",
    ]
)
# Its "fp32_set_opt_dtype" list: run with dtype=float32 when the input is 16-bit and no dtype is given.
_FP32_OUT = frozenset(["softmax", "log_softmax", "cumsum", "cumprod", "prod", "sum", "nansum"])
_LOW = (torch.float16, torch.bfloat16)
_DROPOUTS = (torch.nn.functional.dropout, torch.dropout)


def pick(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None,
    enable_gqa: bool,
) -> str:
    """The SDPA backend CUDA runs for these inputs on an sm80+ GPU: "flash", "efficient" or "math".

    Examples:
        >>> q = torch.empty(1, 8, 16, 64, dtype=torch.bfloat16)
        >>> pick(q, q, q, attn_mask=None, enable_gqa=False), pick(q.float(), q.float(), q.float(), attn_mask=None, enable_gqa=False)
        ('flash', 'efficient')
    """
    dims = {query.shape[-1], key.shape[-1], value.shape[-1]}
    same_heads = query.shape[1] == key.shape[1] == value.shape[1]
    if query.dim() != 4 or len(dims) != 1:
        return "math"
    head = dims.pop()
    if (
        query.dtype in (torch.float16, torch.bfloat16)
        and attn_mask is None
        and head <= 256
        and head % 8 == 0
        and (same_heads or enable_gqa)
    ):
        return "flash"
    # Memory-efficient: fp32 too, masks too; needs aligned head sizes and equal head counts.
    if query.dtype in (torch.float32, torch.float16, torch.bfloat16) and head % 8 == 0 and same_heads:
        return "efficient"
    return "math"


def _sdpa(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args, strict=False)) | kwargs
    q, k, v = bound["query"], bound["key"], bound["value"]
    mask, p = bound.get("attn_mask"), float(bound.get("dropout_p", 0.0))
    causal, scale, gqa = bool(bound.get("is_causal", False)), bound.get("scale"), bool(bound.get("enable_gqa", False))
    backend = pick(q, k, v, attn_mask=mask, enable_gqa=gqa)
    aten = torch.ops.aten
    if backend == "flash":
        # Flash reads grouped key/value heads in place (no repeat), as FlashAttention-2 does.
        return aten._scaled_dot_product_flash_attention(q, k, v, p, causal, False, scale=scale)[0]
    if backend == "efficient":
        if mask is not None and mask.dtype == torch.bool:  # the kernel takes an additive bias
            mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(mask.logical_not(), float("-inf"))
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, grad, p, causal, scale=scale)[0]
    return aten._scaled_dot_product_attention_math(q, k, v, mask, p, causal, None, scale=scale, enable_gqa=gqa)[0]


class CudaKernels(TorchFunctionMode):
    """Run SDPA and dropout as a CUDA step would (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.backends: list[str] = []  # the SDPA backend of each call, in order

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if torch.is_autocast_enabled("cpu"):
            args, kwargs = _autocast(func, args, kwargs)
        if func is _SDPA:
            q, k, v = args[:3]
            self.backends.append(
                pick(q, k, v, attn_mask=kwargs.get("attn_mask", args[3] if len(args) > 3 else None),
                     enable_gqa=bool(kwargs.get("enable_gqa", False)))
            )  # fmt: skip
            return _sdpa(tuple(args), kwargs)
        if func in _DROPOUTS:
            names = ("input", "p", "training", "inplace")
            bound = dict(zip(names, args, strict=False)) | kwargs
            x, p, train = bound["input"], float(bound.get("p", 0.5)), bool(bound.get("training", True))
            if train and 0.0 < p < 1.0 and x.numel() > 0:
                return torch.ops.aten.native_dropout(x, p, True)[0]
        return func(*args, **kwargs)


def _autocast(func: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The casts CUDA autocast makes and CPU autocast does not, for ``func``'s arguments."""
    name = getattr(func, "__name__", "").strip("_")
    if func is _SDPA:
        low = torch.get_autocast_dtype("cpu")
        cast = [a.to(low) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        return tuple(cast), {
            k: v.to(low) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kwargs.items()
        }
    if name in _FP32:
        up = [a.float() if isinstance(a, torch.Tensor) and a.dtype in _LOW else a for a in args]
        return tuple(up), {
            k: v.float() if isinstance(v, torch.Tensor) and v.dtype in _LOW else v for k, v in kwargs.items()
        }
    first = args[0] if args else None
    # A dtype given by position (rare: F.softmax's fourth argument) is left alone.
    half = isinstance(first, torch.Tensor) and first.dtype in _LOW
    if name in _FP32_OUT and half and len(args) <= 2 and kwargs.get("dtype") is None:
        return args, {**kwargs, "dtype": torch.float32}
    return args, kwargs
