"""``cpu_offload_with_hook``: a model moves whole to the execution device at its forward and stays
there until ``hook.offload()`` or until the next model of a chain runs (Accelerate's semantics).

Without a GPU the "execution device" is ``meta``: each test model keeps a copy of its weights and,
moved back to the CPU from meta, gets them back, so a chain moves and computes as it would on a
GPU, and the log of moves and forwards shows the order in which the hooks acted.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import x_bigmodel
from x_bigmodel import ModelHook, UserCpuOffloadHook, add_hook_to_module, cpu_offload_with_hook


class Stage(nn.Module):
    """A linear layer that logs its moves and forwards into ``log``."""

    def __init__(self, name: str, log: list[tuple[str, ...]]) -> None:
        super().__init__()
        self.label = name
        self.log = log
        torch.manual_seed(len(name) + len(log))
        self.layer = nn.Linear(4, 4)
        self.saved = {k: v.clone() for k, v in self.layer.state_dict().items()}

    def to(self, device, *args, **kwargs):  # type: ignore[override]
        device = torch.device(device)
        self.log.append((self.label, "to", device.type))
        if device.type == "cpu" and self.layer.weight.device.type == "meta":
            self.layer.to_empty(device="cpu")
            self.layer.load_state_dict(self.saved)
            return self
        return super().to(device, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append((self.label, "forward", self.layer.weight.device.type, x.device.type))
        return self.layer(x)


def where(*models: Stage) -> list[str]:
    return [m.layer.weight.device.type for m in models]


def run_chain(offload_with_hook, execution_device) -> list[tuple[str, ...]]:
    """Three models chained on ``execution_device``; checks where the weights are at each step."""
    log: list[tuple[str, ...]] = []
    m1, h1 = offload_with_hook(Stage("m1", log), execution_device)
    m2, h2 = offload_with_hook(Stage("m2", log), execution_device, prev_module_hook=h1)
    m3, h3 = offload_with_hook(Stage("m3", log), execution_device, prev_module_hook=h2)
    assert where(m1, m2, m3) == ["cpu", "cpu", "cpu"]
    hidden = m1(torch.ones(1, 4))
    assert where(m1, m2, m3) == ["meta", "cpu", "cpu"]  # stays after its forward
    for _ in range(3):
        out = m2(hidden)
        assert where(m1, m2, m3) == ["cpu", "meta", "cpu"]  # m1 offloaded by m2's first forward
    m3(out)
    assert where(m1, m2, m3) == ["cpu", "cpu", "meta"]
    h3.offload()
    assert where(m1, m2, m3) == ["cpu", "cpu", "cpu"]
    h3.remove()
    assert not hasattr(m3, "_hf_hook")
    m3(torch.ones(1, 4))  # no hook: runs where it is
    assert where(m3) == ["cpu"]
    return log


EXPECTED = [
    ("m1", "to", "cpu"),  # attaching offloads each model to the CPU
    ("m2", "to", "cpu"),
    ("m3", "to", "cpu"),
    ("m1", "to", "meta"),
    ("m1", "forward", "meta", "meta"),  # inputs sent to the execution device too
    ("m1", "to", "cpu"),  # before m2 moves: the previous model goes back first
    ("m2", "to", "meta"),
    ("m2", "forward", "meta", "meta"),
    ("m2", "forward", "meta", "meta"),  # later forwards move nothing
    ("m2", "forward", "meta", "meta"),
    ("m2", "to", "cpu"),
    ("m3", "to", "meta"),
    ("m3", "forward", "meta", "meta"),
    ("m3", "to", "cpu"),  # h3.offload()
    ("m3", "forward", "cpu", "cpu"),  # after h3.remove()
]


def test_a_chain_moves_each_model_once_and_offloads_the_previous_first() -> None:
    assert run_chain(cpu_offload_with_hook, "meta") == EXPECTED


def test_the_chain_acts_as_accelerates() -> None:
    big_modeling = pytest.importorskip("accelerate.big_modeling")
    # Accelerate compares the weights' device with the execution device as given: a torch.device.
    assert run_chain(big_modeling.cpu_offload_with_hook, torch.device("meta")) == EXPECTED


def test_on_the_cpu_outputs_are_the_models_and_nothing_moves() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    want = model(x)
    model, hook = cpu_offload_with_hook(model, "cpu")
    assert isinstance(hook, UserCpuOffloadHook) and hook.model is model
    assert hook.hook.execution_device == torch.device("cpu") and hook.hook.prev_module_hook is None
    assert torch.equal(model(x), want)
    assert all(p.device.type == "cpu" for p in model.parameters())
    hook.offload()
    hook.remove()
    assert not hasattr(model, "_hf_hook") and torch.equal(model(x), want)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the default is the accelerator here")
def test_the_default_execution_device_without_an_accelerator_is_the_cpu() -> None:
    _, hook = cpu_offload_with_hook(nn.Linear(2, 2))
    assert hook.hook.execution_device == torch.device("cpu")


def test_the_hook_is_appended_to_an_existing_one_and_remove_takes_both() -> None:
    class Double(ModelHook):
        def post_forward(self, module, output):
            return output * 2

    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    want = model(x)
    add_hook_to_module(model, Double())
    model, hook = cpu_offload_with_hook(model, "cpu")
    assert torch.equal(model(x), want * 2)
    assert [type(h).__name__ for h in model._hf_hook.hooks] == ["Double", "CpuOffload"]
    hook.remove()
    assert torch.equal(model(x), want)


def test_a_model_without_weights_runs() -> None:
    model, _ = cpu_offload_with_hook(nn.ReLU(), "meta")
    assert model(torch.ones(2)).device.type == "meta"


def test_exported() -> None:
    assert "cpu_offload_with_hook" in x_bigmodel.__all__ and "UserCpuOffloadHook" in x_bigmodel.__all__
    from x_bigmodel.dispatch.entry_points import cpu_offload_with_hook as reexported

    assert reexported is cpu_offload_with_hook
