"""``AlignDevicesHook`` with Accelerate's arguments, ``attach_align_device_hook``,
``has_offloaded_params``, ``align_module_device`` and ``get_state_dict_offloaded_model``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from x_bigmodel import (
    AlignDevicesHook,
    OffloadedWeightsLoader,
    add_hook_to_module,
    align_module_device,
    attach_align_device_hook,
    cpu_offload_with_hook,
    disk_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
    init_empty_weights,
    offload_state_dict,
    remove_hook_from_module,
    remove_hook_from_submodules,
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.batchnorm(self.linear1(x)))


class UsesChildWeight(nn.Module):
    """Reads its child's weight without calling the child: needs the whole subtree preloaded."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.inner.weight.t()


def _trained() -> Net:
    torch.manual_seed(0)
    model = Net()
    model.batchnorm.running_mean.fill_(0.5)
    model.batchnorm.running_var.fill_(2.0)
    return model.eval()


def test_offloading_hook_keeps_weights_on_meta_between_forwards() -> None:
    model = _trained()
    x = torch.randn(2, 3)
    expected = model(x)
    weight = model.linear1.weight.detach().clone()
    for child in (model.linear1, model.batchnorm, model.linear2):
        add_hook_to_module(child, AlignDevicesHook("cpu", offload=True))
    assert model.linear1.weight.device.type == "meta"
    assert isinstance(model.linear1.weight, nn.Parameter)
    assert model.batchnorm.running_mean.device.type == "cpu"  # buffers stay by default
    assert has_offloaded_params(model.linear1) and not has_offloaded_params(model)
    assert torch.allclose(model(x), expected)
    assert model.linear2.weight.device.type == "meta"  # released after the forward
    assert torch.equal(model.linear1._hf_hook.weights_map["weight"], weight)
    remove_hook_from_submodules(model)
    assert model.linear1.weight.device.type == "cpu"
    assert torch.equal(model.linear1.weight, weight)
    assert torch.allclose(model(x), expected)


def test_offload_buffers_and_skip_keys() -> None:
    model = _trained()
    hook = AlignDevicesHook("cpu", offload=True, offload_buffers=True, skip_keys="cache")
    assert hook.skip_keys == ("cache",)
    add_hook_to_module(model.batchnorm, hook)
    assert model.batchnorm.running_mean.device.type == "meta"
    out = model.batchnorm(torch.ones(2, 4))
    assert torch.allclose(out, (torch.ones(2, 4) - 0.5) / torch.sqrt(torch.tensor(2.0 + 1e-5)))
    remove_hook_from_module(model.batchnorm)
    assert torch.equal(model.batchnorm.running_mean, torch.full((4,), 0.5))


def test_attach_align_device_hook_reads_weights_from_an_offload_folder(tmp_path: Path) -> None:
    reference = _trained()
    x = torch.randn(2, 3)
    expected = reference(x)
    offload_state_dict(tmp_path, reference.state_dict())
    with init_empty_weights(include_buffers=True):
        model = Net().eval()
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=loader, offload_buffers=True)
    assert not hasattr(model, "_hf_hook")  # no parameters of its own
    assert all(has_offloaded_params(m) for m in (model.linear1, model.batchnorm, model.linear2))
    assert torch.allclose(model(x), expected)
    assert model.linear1.weight.device.type == "meta"
    state = get_state_dict_offloaded_model(model)
    assert list(state) == list(reference.state_dict())
    for name, value in reference.state_dict().items():
        assert torch.equal(state[name], value)
    remove_hook_from_submodules(model)
    assert model.linear1.weight.device.type == "meta"  # nothing to put back: it was never loaded


def test_preload_module_classes_bring_in_the_whole_subtree() -> None:
    model = nn.Sequential(UsesChildWeight())
    x = torch.randn(2, 4)
    expected = model(x)
    attach_align_device_hook(model, execution_device="cpu", offload=True, preload_module_classes=["UsesChildWeight"])
    assert has_offloaded_params(model[0]) and not hasattr(model[0].inner, "_hf_hook")
    assert model[0].inner.weight.device.type == "meta"
    assert torch.allclose(model(x), expected)


def test_has_offloaded_params_only_for_offloading_align_hooks() -> None:
    model = nn.Linear(2, 2)
    attach_align_device_hook(model)
    assert isinstance(model._hf_hook, AlignDevicesHook) and not has_offloaded_params(model)
    remove_hook_from_module(model)
    model, _ = cpu_offload_with_hook(model)
    assert not has_offloaded_params(model)
    remove_hook_from_module(model)
    attach_align_device_hook(model, offload=True)
    assert has_offloaded_params(model)


def test_align_module_device_on_an_offloaded_module() -> None:
    model = _trained()
    weight = model.linear2.weight.detach().clone()
    attach_align_device_hook(model, execution_device="cpu", offload=True)
    with align_module_device(model.linear2):
        assert torch.equal(model.linear2.weight, weight)
        assert model.linear1.weight.device.type == "meta"
    assert model.linear2.weight.device.type == "meta"
    with align_module_device(model.linear2, "meta"):
        assert model.linear2.weight.device.type == "meta"


def test_align_module_device_moves_own_parameters_and_back() -> None:
    layer = nn.Linear(2, 3)
    weight = layer.weight.detach().clone()
    with align_module_device(layer, "meta"):
        assert layer.weight.device.type == "meta" and isinstance(layer.weight, nn.Parameter)
    assert layer.weight.device.type == "cpu" and torch.equal(layer.weight, weight)
    with align_module_device(layer):
        assert layer.weight.device.type == "cpu"


def test_disk_offloaded_model_read_back(tmp_path: Path) -> None:
    model = _trained()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    disk_offload(model, tmp_path, execution_device="cpu")
    assert model.linear1.weight.device.type == "meta"
    assert has_offloaded_params(model.linear1)
    with align_module_device(model.linear1):
        assert torch.equal(model.linear1.weight, state["linear1.weight"])
    assert model.linear1.weight.device.type == "meta"
    got = get_state_dict_offloaded_model(model)
    assert list(got) == list(state)
    for name, value in state.items():
        assert torch.equal(got[name], value)


def test_get_state_dict_offloaded_model_rejects_meta_without_a_hook() -> None:
    with init_empty_weights():
        model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="weight is on the meta device"):
        get_state_dict_offloaded_model(model)


def test_align_module_device_keeps_changes_made_in_the_block() -> None:
    layer = nn.Linear(2, 3)
    with align_module_device(layer, "cpu"), torch.no_grad():
        layer.weight.fill_(3.0)
    assert torch.equal(layer.weight, torch.full((3, 2), 3.0))


def test_get_state_dict_from_offload_reads_a_disk_offloaded_module_back(tmp_path) -> None:
    from x_bigmodel import disk_offload, get_state_dict_from_offload

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    reference = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    disk_offload(model, str(tmp_path), execution_device="cpu")
    assert model[1].weight.device.type == "meta"
    wanted = {"1.weight": "placeholder", "1.bias": "placeholder", "0.weight": "kept"}
    got = get_state_dict_from_offload(model[1], "1.weight", wanted)
    assert got is wanted and got["0.weight"] == "kept"  # only the module's own entries are filled
    assert torch.equal(got["1.weight"], reference["1.weight"]) and torch.equal(got["1.bias"], reference["1.bias"])
    assert got["1.weight"].device.type == "cpu" and model[1].weight.device.type == "meta"  # offloaded again
