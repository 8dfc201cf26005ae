"""The fake kernels' outputs against the CPU kernels' own, where the meta kernels differ."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from x_estimate.simulate.fake_kernels import FakeKernels


def _norms() -> dict[str, Any]:
    """Layer, group and batch norm of a bfloat16 input with float32 weights, as autocast leaves them."""
    x = torch.randn(2, 8, 4, 4, dtype=torch.bfloat16)
    w, b = torch.ones(8), torch.zeros(8)
    aten = torch.ops.aten
    return {
        "layer": aten.native_layer_norm(x.permute(0, 2, 3, 1), [8], w, b, 1e-6),
        "group": aten.native_group_norm(x, w, b, 2, 8, 16, 2, 1e-5),
        "batch": aten.native_batch_norm(x, w, b, torch.zeros(8), torch.ones(8), True, 0.1, 1e-5),
    }


@pytest.mark.parametrize("norm", ["layer", "group", "batch"])
def test_mixed_precision_norms_save_float32_statistics_as_the_cpu_kernels_do(norm: str) -> None:
    real = _norms()[norm]
    with FakeTensorMode(), FakeKernels():
        fake = _norms()[norm]
    assert [(t.dtype, tuple(t.shape)) for t in fake] == [(t.dtype, tuple(t.shape)) for t in real]
    assert real[1].dtype == torch.float32  # the CPU keeps mean and inverse std in float32


def test_norms_without_mixed_types_pass_through() -> None:
    def norm() -> Any:
        x = torch.randn(2, 4, 8, dtype=torch.bfloat16)
        w, b = torch.ones(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
        return torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-6)

    real = norm()
    with FakeTensorMode(), FakeKernels():
        fake = norm()
    assert [t.dtype for t in fake] == [t.dtype for t in real] == [torch.bfloat16] * 3  # pure bf16 keeps bf16
