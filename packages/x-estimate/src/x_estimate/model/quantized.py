"""Sizes of a model quantized the way real int8/int4 loaders do it.

Dividing the whole model by 4 or 8 (what Accelerate prints) is wrong twice: loaders quantize
only the linear layers' weights, keeping embeddings, norms, biases and the output head in
16-bit; and every quantized weight carries scales. Formats (bytes for a weight of ``out x in``):

- ``int8`` (bitsandbytes LLM.int8): ``out*in`` int8 + one float32 scale per row (``4*out``);
- ``nf4`` (bitsandbytes 4-bit): ``out*in/2`` + one float32 absmax per block of 64 values;
- ``nf4-dq`` (with double quantization): absmax in 8 bits per 64 values + one float32 per 256 blocks;
- ``gptq`` (4-bit, group 128): packed weights + float16 scale and 4-bit zero per group and output,
  + an int32 group index per input feature;
- ``awq`` (4-bit, group 128): as ``gptq`` without the group index.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from x_common.module_sizes import sizes_of
from x_estimate.model.summary import ModelSummary

__all__ = ["INT4_FORMATS", "quantized_sizes"]

INT4_FORMATS = ("nf4", "nf4-dq", "gptq", "awq")
UNQUANTIZED_DTYPE = "float16"


def _int8(out: int, inp: int) -> int:
    return out * inp + 4 * out


def _nf4(out: int, inp: int) -> int:
    n = out * inp
    return math.ceil(n / 2) + 4 * math.ceil(n / 64)


def _nf4_dq(out: int, inp: int) -> int:
    n = out * inp
    blocks = math.ceil(n / 64)
    return math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / 256)


def _group128(out: int, inp: int, *, g_idx: bool) -> int:
    groups = math.ceil(inp / 128)
    return math.ceil(out * inp / 2) + groups * out * 2 + math.ceil(groups * out / 2) + (4 * inp if g_idx else 0)


_FORMATS: dict[str, Callable[[int, int], int]] = {
    "int8": _int8,
    "nf4": _nf4,
    "nf4-dq": _nf4_dq,
    "gptq": lambda out, inp: _group128(out, inp, g_idx=True),
    "awq": lambda out, inp: _group128(out, inp, g_idx=False),
}


def quantized_sizes(summary: ModelSummary, fmt: str) -> tuple[dict[str, int], int]:
    """(bytes under every module name, number of weights quantized) for ``fmt`` ("int8" or an int4 format).

    Tied tensors (held under several names) stay unquantized, as loaders skip them.
    """
    if fmt not in _FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}; expected int8 or one of {', '.join(INT4_FORMATS)}")
    sizes = sizes_of(summary.tensors, UNQUANTIZED_DTYPE)
    single = {t.names[0] for t in summary.tensors if len(t.names) == 1}
    count = 0
    for name, (out, inp) in summary.linear.items():
        if name not in single:
            continue
        delta = _FORMATS[fmt](out, inp) - out * inp * 2
        parts = name.split(".")
        for i in range(len(parts) + 1):
            sizes[".".join(parts[:i])] += delta
        count += 1
    return sizes, count
