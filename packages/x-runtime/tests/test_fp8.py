"""fp8: the recipe objects, the refusal where fp8 cannot run, and the conversion on fp8 GPUs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from x_common import env
from x_runtime import Accelerator, AORecipeKwargs, TERecipeKwargs
from x_runtime.precision.fp8 import _default_filter, fp8_recipe


def test_fp8_on_cpu_is_refused_before_anything_is_built() -> None:
    with pytest.raises(ValueError) as caught:
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    assert str(caught.value) == (
        "mixed_precision='fp8' needs an NVIDIA GPU of compute capability >= 8.9 (H100, L4, RTX 4090); this run "
        "computes on cpu: use 'bf16'"
    )


def test_fp8_from_the_launcher_is_refused_the_same_way(monkeypatch) -> None:
    monkeypatch.setenv(env.MIXED_PRECISION.name, "fp8")
    with pytest.raises(ValueError, match="mixed_precision='fp8' needs an NVIDIA GPU"):
        Accelerator(cpu=True)


def test_transformer_engine_recipe_names_the_supported_one() -> None:
    with pytest.raises(ValueError, match=r"x_runtime runs fp8 through torchao; pass AORecipeKwargs\(\)"):
        fp8_recipe(TERecipeKwargs(fp8_format="HYBRID"))


def test_recipe_handlers_are_accepted_by_the_accelerator_without_fp8() -> None:
    # A recipe passed with mixed_precision="no" (a config switched off fp8) is kept, unused.
    accelerator = Accelerator(cpu=True, kwargs_handlers=[AORecipeKwargs()])
    assert accelerator.fp8_recipe is None and accelerator.mixed_precision == "no"


def test_default_filter_skips_first_last_and_unaligned_linears() -> None:
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 24), nn.Linear(24, 32), nn.Linear(32, 8))
    keep = _default_filter(model)
    assert [keep(m, n) for n, m in model.named_children()] == [False, True, False, False, False]


@pytest.mark.requires_cuda(1)
def test_fp8_converts_linears_and_trains_on_an_fp8_gpu() -> None:
    capability = torch.cuda.get_device_capability()
    if capability < (8, 9):
        with pytest.raises(ValueError, match=r"needs compute capability >= 8\.9"):
            Accelerator(mixed_precision="fp8")
        return
    pytest.importorskip("torchao")
    accelerator = Accelerator(mixed_precision="fp8")
    model = nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    assert type(model[1]).__name__ == "Float8Linear" and type(model[0]) is nn.Linear
    x = torch.randn(32, 64, device=accelerator.device)
    first = None
    for _ in range(5):
        loss = model(x).pow(2).mean()
        first = first if first is not None else loss.item()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    assert loss.item() < first
