"""init_empty_weights / init_on_device: skeletons without memory, nesting, restoration."""

from __future__ import annotations

import time

import pytest
import torch

from x_bigmodel.planning.empty_weights import init_empty_weights, init_on_device

ORIGINAL_REGISTER_PARAMETER = torch.nn.Module.register_parameter
ORIGINAL_REGISTER_BUFFER = torch.nn.Module.register_buffer


class WithBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("positions", torch.arange(4))
        self.register_buffer("scratch", torch.empty(3))


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight


class FlaggedParameter(torch.nn.Parameter):
    pass


class Custom(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)
        self.flagged = FlaggedParameter(torch.ones(2))


def assert_restored() -> None:
    assert torch.nn.Module.register_parameter is ORIGINAL_REGISTER_PARAMETER
    assert torch.nn.Module.register_buffer is ORIGINAL_REGISTER_BUFFER
    assert torch.empty(1).device.type == "cpu"
    assert torch.zeros(1).device.type == "cpu"


def test_ten_billion_parameters_allocate_nothing() -> None:
    start = time.perf_counter()
    with init_empty_weights():
        # 10 x (100_000 x 10_000) = 10 billion parameters: 40 GB in float32 if anything were allocated.
        model = torch.nn.Sequential(*[torch.nn.Linear(10_000, 100_000, bias=False) for _ in range(10)])
    elapsed = time.perf_counter() - start
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == 10_000_000_000
    assert all(p.is_meta for p in params)
    assert all(type(p) is torch.nn.Parameter and p.requires_grad for p in params)
    assert elapsed < 5.0
    assert_restored()


def test_single_weight_larger_than_ram_is_never_allocated() -> None:
    # One 4 TB weight: creating it on the CPU first (as Accelerate does) would fail here.
    with init_empty_weights():
        layer = torch.nn.Linear(1_000_000, 1_000_000)
    assert layer.weight.is_meta and layer.weight.shape == (1_000_000, 1_000_000)


def test_buffers_stay_real_by_default() -> None:
    with init_empty_weights():
        module = WithBuffer()
    assert module.linear.weight.is_meta and module.linear.bias.is_meta
    assert module.positions.device.type == "cpu"
    assert torch.equal(module.positions, torch.arange(4))
    # A torch.empty buffer is recreated on the CPU (its values were undefined anyway).
    assert module.scratch.device.type == "cpu" and module.scratch.shape == (3,)
    assert_restored()


def test_include_buffers_puts_buffers_on_meta() -> None:
    with init_empty_weights(include_buffers=True):
        module = WithBuffer()
        inside = torch.zeros(2)
    assert module.positions.is_meta and module.scratch.is_meta and module.linear.weight.is_meta
    assert inside.is_meta
    assert_restored()


def test_parameter_class_and_requires_grad_preserved() -> None:
    with init_empty_weights():
        module = Custom()
    assert module.frozen.is_meta and not module.frozen.requires_grad
    assert type(module.flagged) is FlaggedParameter and module.flagged.is_meta and module.flagged.requires_grad


def test_ties_made_in_init_survive() -> None:
    with init_empty_weights():
        model = Tied()
    assert model.head.weight is model.emb.weight
    assert model.emb.weight.is_meta
    assert len(list(model.parameters())) == 1


def test_init_on_device_cpu_keeps_values() -> None:
    with init_on_device("cpu"):
        layer = torch.nn.Linear(3, 3)
    assert layer.weight.device.type == "cpu"
    assert torch.isfinite(layer.weight).all()


def test_nesting_inner_wins_and_outer_is_restored() -> None:
    with init_on_device("cpu", include_buffers=True):
        with init_empty_weights():
            inner = WithBuffer()
        assert inner.linear.weight.is_meta
        assert inner.positions.device.type == "cpu"
        outer = WithBuffer()
        assert outer.linear.weight.device.type == "cpu"
        with init_empty_weights(include_buffers=True):
            inner_buffers = WithBuffer()
        assert inner_buffers.positions.is_meta
        after = WithBuffer()
        assert after.linear.weight.device.type == "cpu" and after.positions.device.type == "cpu"
    assert_restored()


def test_nesting_empty_in_empty() -> None:
    with init_empty_weights(include_buffers=True):
        with init_empty_weights():
            inner = WithBuffer()
        assert inner.positions.device.type == "cpu"  # the inner block keeps buffers real
        outer = WithBuffer()
        assert outer.positions.is_meta
    assert_restored()


@pytest.mark.parametrize("include_buffers", [False, True])
def test_restored_after_exception(include_buffers: bool) -> None:
    outer, inner = init_empty_weights(include_buffers), init_empty_weights(not include_buffers)
    with pytest.raises(RuntimeError, match="boom"), outer, inner:
        raise RuntimeError("boom")
    assert_restored()
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"


def test_modules_outside_are_untouched() -> None:
    with init_empty_weights():
        pass
    layer = torch.nn.Linear(2, 2)
    assert not layer.weight.is_meta
    assert_restored()


@pytest.mark.requires_cuda(1)
def test_init_on_cuda_creates_parameters_and_buffers_there() -> None:
    with init_on_device("cuda", include_buffers=True):
        model = Tied()
        module = WithBuffer()
    assert model.emb.weight.device.type == "cuda" and model.head.weight is model.emb.weight
    assert module.linear.weight.is_cuda and module.positions.is_cuda
    assert torch.equal(module.positions.cpu(), torch.arange(4))
    assert_restored()
