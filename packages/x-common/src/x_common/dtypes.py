"""Storage size of tensor element types, by torch dtype or by name.

Sizes are in *bits* first, because quantised formats (``int4``, ``nf4``, ``fp4``) store less
than a byte per value; byte sizes are derived from bits. No torch import is needed to ask
about a name; a ``torch.dtype`` is accepted through its ``str()``.

Where we differ from Accelerate's ``dtype_byte_size``: ``torch.bool`` occupies one byte per
element in memory (Accelerate counts 1/8), and torch's sub-byte shell types ``int1``..``int7``
and ``uint1``..``uint7`` count their nominal width (packed storage), not torch's 1-byte itemsize.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["DTYPE_BITS", "dtype_bits", "dtype_byte_size", "dtype_name", "is_floating", "tensor_nbytes"]

# Bits per element, keyed by torch's canonical dtype name (what ``str(torch.<x>)`` prints
# after "torch.").  ``float4_e2m1fn_x2`` and ``quint4x2``/``quint2x4`` are one byte holding
# several packed values: one *element* of that dtype is a byte.
DTYPE_BITS: dict[str, int] = {
    "float64": 64,
    "float32": 32,
    "float16": 16,
    "bfloat16": 16,
    "float8_e4m3fn": 8,
    "float8_e4m3fnuz": 8,
    "float8_e5m2": 8,
    "float8_e5m2fnuz": 8,
    "float8_e8m0fnu": 8,
    "float4_e2m1fn_x2": 8,
    "complex128": 128,
    "complex64": 64,
    "complex32": 32,
    "int64": 64,
    "int32": 32,
    "int16": 16,
    "int8": 8,
    "uint64": 64,
    "uint32": 32,
    "uint16": 16,
    "uint8": 8,
    "bool": 8,
    "qint32": 32,
    "qint8": 8,
    "quint8": 8,
    "quint4x2": 8,
    "quint2x4": 8,
    "bits16": 16,
    "bits8": 8,
    "bits1x8": 8,
    "bits2x4": 8,
    "bits4x2": 8,
    **{f"int{n}": n for n in range(1, 8)},
    **{f"uint{n}": n for n in range(1, 8)},
    # Quantisation formats that are not torch dtypes but that users size models in.
    "fp8": 8,
    "fp4": 4,
    "nf4": 4,
}

_ALIASES = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "cdouble": "complex128",
    "cfloat": "complex64",
    "chalf": "complex32",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "bit": "uint1",
}

_FLOATING = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "fp8",
    "fp4",
    "nf4",
}


def dtype_name(dtype: Any) -> str:
    """Canonical name of a dtype given as ``torch.dtype`` or string.

    Examples:
        >>> dtype_name("bf16")
        'bfloat16'
        >>> dtype_name("torch.half")
        'float16'
        >>> dtype_name(enum.Enum("CustomDtype", {"INT4": "int4"}).INT4)
        'int4'

    Raises:
        ValueError: the name is not a known dtype; the message lists the accepted names.
    """
    if isinstance(dtype, enum.Enum) and isinstance(dtype.value, str):
        dtype = dtype.value  # Accelerate's CustomDtype.INT4 is "int4"
    if not isinstance(dtype, str):
        if type(dtype).__name__ != "dtype":
            raise ValueError(f"invalid dtype {dtype!r}: expected a torch.dtype or a name such as 'float16'")
        dtype = str(dtype)
    key = dtype.strip().lower()
    key = key.removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in DTYPE_BITS:
        accepted = ", ".join(sorted(set(DTYPE_BITS) | set(_ALIASES)))
        raise ValueError(f"unknown dtype {dtype!r}; accepted names: {accepted}")
    return key


def dtype_bits(dtype: Any) -> int:
    """Bits one element of ``dtype`` occupies.

    Examples:
        >>> dtype_bits("int4"), dtype_bits("float16")
        (4, 16)
    """
    return DTYPE_BITS[dtype_name(dtype)]


def dtype_byte_size(dtype: Any) -> float:
    """Bytes one element of ``dtype`` occupies (0.5 for 4-bit formats).

    Examples:
        >>> dtype_byte_size("float32"), dtype_byte_size("int4")
        (4.0, 0.5)
    """
    return dtype_bits(dtype) / 8


def is_floating(dtype: Any) -> bool:
    """Whether ``dtype`` holds real floating-point values (what a dtype cast converts).

    Examples:
        >>> is_floating("bf16"), is_floating("int8")
        (True, False)
    """
    return dtype_name(dtype) in _FLOATING


def tensor_nbytes(numel: int, dtype: Any) -> int:
    """Bytes needed to store ``numel`` elements of ``dtype``, rounding packed bits up to a byte.

    Examples:
        >>> tensor_nbytes(3, "int4")
        2
    """
    if numel < 0:
        raise ValueError(f"invalid element count {numel}: must be >= 0")
    return (numel * dtype_bits(dtype) + 7) // 8
