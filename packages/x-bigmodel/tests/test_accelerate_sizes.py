"""Accelerate's size and tie helpers on x, side by side with Accelerate's own (1.15, installed beside)."""

from __future__ import annotations

import pytest
import torch
from accelerate.utils import modeling as theirs
from torch import nn

import x_bigmodel as ours


def _models() -> list[nn.Module]:
    tied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    norm = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    norm.register_buffer("mask", torch.ones(5, dtype=torch.bool))
    norm.register_buffer("scratch", torch.zeros(7), persistent=False)
    return [nn.Linear(3, 4), tied, norm, norm.half()]


@pytest.mark.parametrize("index", range(4))
@pytest.mark.parametrize("dtype", [None, "float16", torch.bfloat16])
def test_module_sizes_and_buffers_count_as_accelerate_counts(index: int, dtype) -> None:
    model = _models()[index]
    assert dict(ours.compute_module_sizes(model, dtype=dtype)) == dict(theirs.compute_module_sizes(model, dtype=dtype))
    assert dict(ours.compute_module_sizes(model, buffers_only=True)) == dict(
        theirs.compute_module_sizes(model, buffers_only=True)
    )
    assert ours.compute_module_total_buffer_size(model) == theirs.compute_module_total_buffer_size(model)
    for kwargs in ({}, {"recurse": True}, {"recurse": True, "remove_non_persistent": True}):
        assert [n for n, _ in ours.named_module_tensors(model, **kwargs)] == [
            n for n, _ in theirs.named_module_tensors(model, **kwargs)
        ]
    for kwargs in ({}, {"recurse": True}, {"recurse": True, "fqns": True}):
        assert ours.get_non_persistent_buffers(model, **kwargs) == theirs.get_non_persistent_buffers(model, **kwargs)
    assert ours.find_tied_parameters(model) == theirs.find_tied_parameters(model)


def test_dtype_sizes_file_sizes_and_retying_match() -> None:
    for dtype in (
        torch.bool,
        torch.uint8,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.int64,
        torch.float8_e4m3fn,
    ):
        assert ours.dtype_byte_size(dtype) == theirs.dtype_byte_size(dtype)
    for size in (0, 123, "0MB", "100MB", "2GiB", "1.5KiB", "5Gb", "8kb", "3KB"):
        assert ours.convert_file_size_to_int(size) == theirs.convert_file_size_to_int(size)
    for bad in ("ten", "5XB", -1):
        with pytest.raises(ValueError, match="is not in a valid format"):
            ours.convert_file_size_to_int(bad)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    groups = [["0.weight", "1.weight"]]
    model[1].weight = nn.Parameter(torch.empty(2, 2, device="meta"))
    ours.retie_parameters(model, groups)
    assert model[1].weight is model[0].weight and ours.find_tied_parameters(model) == groups
