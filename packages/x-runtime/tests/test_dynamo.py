"""torch.compile of prepared models: whole or regional, same results and same parameter names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from x_common import env
from x_runtime import Accelerator, TorchDynamoPlugin
from x_runtime.precision.dynamo import repeated_blocks


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList(Layer() for _ in range(4))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _train(accelerator: Accelerator) -> tuple[torch.Tensor, nn.Module]:
    torch.manual_seed(0)
    model = Stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        accelerator.backward(model(x).pow(2).mean())
        opt.step()
        opt.zero_grad()
    return model(x).detach(), model


def test_repeated_blocks_are_the_children_of_uniform_module_lists() -> None:
    model = Stack()
    assert repeated_blocks(model) == list(model.layers)
    assert repeated_blocks(nn.Sequential(nn.Linear(2, 2))) == []


def test_regional_compilation_keeps_the_model_object_names_and_results() -> None:
    torch._dynamo.reset()
    expected, _ = _train(Accelerator(cpu=True))
    plugin = TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=True)
    output, model = _train(Accelerator(cpu=True, dynamo_plugin=plugin))
    assert isinstance(model, Stack)  # compiled in place, no OptimizedModule wrapper
    assert list(model.state_dict()) == list(Stack().state_dict())
    assert all(layer._compiled_call_impl is not None for layer in model.layers)
    assert model.embed._compiled_call_impl is None
    torch.testing.assert_close(output, expected)


def test_whole_model_compilation_from_the_launcher(monkeypatch) -> None:
    torch._dynamo.reset()
    expected, _ = _train(Accelerator(cpu=True))
    monkeypatch.setenv(env.DYNAMO_BACKEND.name, "aot_eager")
    accelerator = Accelerator(cpu=True)
    output, model = _train(accelerator)
    assert accelerator.dynamo_backend == "aot_eager"
    assert hasattr(model, "_orig_mod")
    assert isinstance(accelerator.unwrap_model(model, keep_torch_compile=False), Stack)
    torch.testing.assert_close(output, expected)


def test_regional_compilation_of_a_model_without_repeated_blocks_is_refused() -> None:
    plugin = TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    with pytest.raises(ValueError, match=r"regional compilation: Sequential has no repeated blocks"):
        Accelerator(cpu=True, dynamo_plugin=plugin).prepare(nn.Sequential(nn.Linear(2, 2)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "turbo"}, "dynamo backend 'turbo' is not one of no, eager"),
        ({"mode": "fastest"}, "dynamo mode 'fastest' is not one of default"),
    ],
)
def test_unknown_backend_or_mode_lists_the_valid_ones(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TorchDynamoPlugin(**kwargs)


def test_backend_and_plugin_together_are_refused() -> None:
    with pytest.raises(ValueError, match="pass dynamo_backend or dynamo_plugin, not both"):
        Accelerator(cpu=True, dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin())
