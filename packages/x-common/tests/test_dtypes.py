"""Bits and bytes per element, by name and by torch.dtype."""

from __future__ import annotations

import importlib.util
import re

import pytest

from x_common.dtypes import DTYPE_BITS, dtype_bits, dtype_byte_size, dtype_name, is_floating, tensor_nbytes

SUB_BYTE = re.compile(r"^u?int[1-7]$")  # torch.int1..int7, torch.uint1..uint7: nominal width


def _torch_dtype_names() -> list[str]:
    """Canonical name of every torch.dtype object exposed as an attribute of ``torch``."""
    if importlib.util.find_spec("torch") is None:
        return []
    import torch

    return sorted({str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)})


TORCH_DTYPES = _torch_dtype_names()


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_every_torch_dtype_has_its_storage_width(name: str) -> None:
    import torch

    dtype = getattr(torch, name)
    expected = int(name.removeprefix("u").removeprefix("int")) if SUB_BYTE.match(name) else dtype.itemsize * 8
    # a dtype torch adds that the table lacks fails here with "unknown dtype"
    assert dtype_bits(dtype) == expected
    assert dtype_bits(str(dtype)) == expected
    assert dtype_bits(name) == expected
    assert dtype_name(dtype) == name
    assert dtype_byte_size(dtype) == expected / 8


def test_table_covers_every_torch_dtype() -> None:
    if not TORCH_DTYPES:
        pytest.skip("torch is not installed")
    assert set(TORCH_DTYPES) - set(DTYPE_BITS) == set()


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_is_floating_agrees_with_torch(name: str) -> None:
    import torch

    dtype = getattr(torch, name)
    # complex numbers are not *real* floating point; torch agrees (is_floating_point is False)
    assert is_floating(dtype) is dtype.is_floating_point


def test_sub_byte_dtypes_count_nominal_width() -> None:
    torch = pytest.importorskip("torch")
    assert [dtype_bits(getattr(torch, f"int{n}")) for n in range(1, 8)] == [1, 2, 3, 4, 5, 6, 7]
    assert [dtype_bits(getattr(torch, f"uint{n}")) for n in range(1, 8)] == [1, 2, 3, 4, 5, 6, 7]
    assert dtype_bits(torch.bool) == 8  # one byte in memory, unlike Accelerate's 1/8


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("fp16", "float16"),
        ("half", "float16"),
        ("torch.float16", "float16"),
        ("torch.half", "float16"),
        ("FP16", "float16"),
        ("bf16", "bfloat16"),
        ("BFloat16", "bfloat16"),
        ("FLOAT32", "float32"),
        ("float", "float32"),
        ("fp32", "float32"),
        ("  fp32  ", "float32"),
        ("Torch.Float32", "float32"),
        ("fp64", "float64"),
        ("double", "float64"),
        ("cdouble", "complex128"),
        ("cfloat", "complex64"),
        ("chalf", "complex32"),
        ("long", "int64"),
        ("int", "int32"),
        ("short", "int16"),
        ("bit", "uint1"),
        ("int8", "int8"),
        ("int4", "int4"),
        ("fp8", "fp8"),
        ("fp4", "fp4"),
        ("nf4", "nf4"),
        ("float8_e4m3fn", "float8_e4m3fn"),
    ],
)
def test_dtype_name_aliases(alias: str, canonical: str) -> None:
    assert dtype_name(alias) == canonical


@pytest.mark.parametrize(
    ("name", "bits", "byte_size", "floating"),
    [
        ("float64", 64, 8.0, True),
        ("float32", 32, 4.0, True),
        ("fp16", 16, 2.0, True),
        ("bf16", 16, 2.0, True),
        ("fp8", 8, 1.0, True),
        ("float8_e5m2", 8, 1.0, True),
        ("fp4", 4, 0.5, True),
        ("nf4", 4, 0.5, True),
        ("float4_e2m1fn_x2", 8, 1.0, True),  # one byte holding two packed values
        ("int64", 64, 8.0, False),
        ("int8", 8, 1.0, False),
        ("uint8", 8, 1.0, False),
        ("int4", 4, 0.5, False),
        ("int2", 2, 0.25, False),
        ("uint1", 1, 0.125, False),
        ("bool", 8, 1.0, False),
        ("complex64", 64, 8.0, False),
        ("complex32", 32, 4.0, False),
        ("quint4x2", 8, 1.0, False),
    ],
)
def test_bits_bytes_and_floating_by_name(name: str, bits: int, byte_size: float, floating: bool) -> None:
    assert dtype_bits(name) == bits
    assert dtype_byte_size(name) == byte_size
    assert is_floating(name) is floating


@pytest.mark.parametrize("name", ["float17", "int9", "fp12", "", "torch.", "torch.float16x", "q4_0"])
def test_unknown_name_lists_accepted_names(name: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        dtype_name(name)
    message = str(excinfo.value)
    assert message.startswith(f"unknown dtype {name!r}; accepted names: ")
    accepted = message.split("accepted names: ", 1)[1].split(", ")
    assert accepted == sorted(accepted)
    for expected in ("bf16", "bfloat16", "float16", "fp16", "fp4", "fp8", "half", "int4", "nf4", "uint1"):
        assert expected in accepted
    # the other entry points say the same
    for function in (dtype_bits, dtype_byte_size, is_floating):
        with pytest.raises(ValueError, match=re.escape(f"unknown dtype {name!r}; accepted names: ")):
            function(name)


@pytest.mark.parametrize("value", [None, 16, 2.0, ["float16"], b"float16", object()])
def test_non_dtype_objects_are_refused(value: object) -> None:
    with pytest.raises(ValueError) as excinfo:
        dtype_name(value)
    assert str(excinfo.value) == f"invalid dtype {value!r}: expected a torch.dtype or a name such as 'float16'"


@pytest.mark.parametrize(
    ("numel", "dtype", "expected"),
    [
        (0, "float32", 0),
        (1, "float32", 4),
        (10, "fp16", 20),
        (3, "int4", 2),  # 12 bits round up to 2 bytes
        (4, "int4", 2),
        (1, "int4", 1),
        (1, "uint1", 1),
        (8, "uint1", 1),
        (9, "uint1", 2),
        (3, "int3", 2),  # 9 bits
        (5, "nf4", 3),
        (7, "bool", 7),
        (2**40, "bf16", 2**41),
    ],
)
def test_tensor_nbytes(numel: int, dtype: str, expected: int) -> None:
    assert tensor_nbytes(numel, dtype) == expected


def test_tensor_nbytes_takes_torch_dtype() -> None:
    torch = pytest.importorskip("torch")
    assert tensor_nbytes(3, torch.int4) == 2
    assert tensor_nbytes(6, torch.bfloat16) == torch.zeros(6, dtype=torch.bfloat16).nbytes


@pytest.mark.parametrize("numel", [-1, -100])
def test_tensor_nbytes_negative_count(numel: int) -> None:
    with pytest.raises(ValueError) as excinfo:
        tensor_nbytes(numel, "float32")
    assert str(excinfo.value) == f"invalid element count {numel}: must be >= 0"
