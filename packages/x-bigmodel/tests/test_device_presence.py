"""Devices that are not here: one line naming those that are, before any weight moves.

On a CPU-only torch, ``device_map={"": 0}`` used to fail halfway through a load with torch's
``AssertionError: Torch not compiled with CUDA enabled``. Maps and budgets may still be *planned*
for another machine (``infer_auto_device_map``, ``get_max_memory`` keep Accelerate's warning);
loading or dispatching refuses them up front.
"""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from x_bigmodel.devices.device_keys import device_key, present_devices, run_device, storage_device
from x_bigmodel.dispatch.entry_points import dispatch_model, load_checkpoint_and_dispatch
from x_bigmodel.loading.checkpoint import load_checkpoint_in_model
from x_bigmodel.planning.device_map import infer_auto_device_map
from x_bigmodel.planning.device_plan import DevicePlan

GPUS = torch.cuda.device_count()
ABSENT = GPUS + 3  # a GPU index this machine lacks, whatever it has
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build's message")


def shown_here() -> str:
    return ", ".join(repr(d) for d in present_devices())


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def meta_net() -> nn.Module:
    with torch.device("meta"):
        return net()


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(net().state_dict(), str(path))
    return path


def assert_one_line(message: str, where: str, device: str) -> None:
    assert "\n" not in message
    assert message.startswith(f"{where} is {device}, but ")
    assert message.endswith(f"; the devices here are {shown_here()}")


@cpu_only
@pytest.mark.parametrize("device", [0, "cuda:7", torch.device("cuda", 1)])
def test_cuda_on_a_cpu_only_torch_names_the_devices_here(checkpoint, device) -> None:
    model = meta_net()
    with pytest.raises(ValueError) as info:
        load_checkpoint_in_model(model, checkpoint, device_map={"": device}, show_progress=False)
    index = device if isinstance(device, int) else torch.device(device).index
    assert str(info.value) == (
        f"device_map[''] is GPU {index}, but torch {torch.__version__} is built without CUDA (a CPU-only build); "
        "the devices here are 'cpu', 'disk'"
    )
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing moved


def test_a_gpu_index_that_does_not_exist(checkpoint) -> None:
    model = meta_net()
    with pytest.raises(ValueError) as info:
        load_checkpoint_in_model(model, checkpoint, device_map={"0": "cpu", "2": ABSENT}, show_progress=False)
    assert_one_line(str(info.value), "device_map['2']", f"GPU {ABSENT}")
    assert all(p.device.type == "meta" for p in model.parameters())


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is here")
def test_mps_where_there_is_none(checkpoint) -> None:
    with pytest.raises(ValueError) as info:
        load_checkpoint_in_model(meta_net(), checkpoint, device_map={"": "mps"}, show_progress=False)
    assert_one_line(str(info.value), "device_map['']", "'mps'")
    assert "MPS is not available" in str(info.value)


@pytest.mark.parametrize("strategy", ["auto", "sequential"])
@pytest.mark.parametrize("key", [ABSENT, f"cuda:{ABSENT}"])
def test_max_memory_naming_an_absent_gpu_is_refused_at_load(checkpoint, strategy, key) -> None:
    model = meta_net()
    with pytest.raises(ValueError) as info:
        load_checkpoint_and_dispatch(
            model, checkpoint, device_map=strategy, max_memory={key: "1GiB", "cpu": "1GiB"}, show_progress=False
        )
    assert_one_line(str(info.value), f"max_memory[{key!r}]", f"GPU {ABSENT}")
    assert all(p.device.type == "meta" for p in model.parameters())


def test_a_dict_map_through_load_checkpoint_and_dispatch(checkpoint) -> None:
    model = meta_net()
    with pytest.raises(ValueError) as info:
        load_checkpoint_and_dispatch(model, checkpoint, device_map={"0": ABSENT, "2": "cpu"}, show_progress=False)
    assert_one_line(str(info.value), "device_map['0']", f"GPU {ABSENT}")
    assert not hasattr(model, "hf_device_map")


@pytest.mark.parametrize("argument", ["device_map", "main_device", "output_device"])
def test_dispatch_model_refuses_before_moving_or_hooking(argument) -> None:
    model = net()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    kwargs = {"device_map": {"": "cpu"}, "force_hooks": True}
    if argument == "device_map":
        kwargs["device_map"] = {"0": "cpu", "2": ABSENT}
    else:
        kwargs[argument] = ABSENT
    with pytest.raises(ValueError) as info:
        dispatch_model(model, **kwargs)
    where = "device_map['2']" if argument == "device_map" else argument
    assert_one_line(str(info.value), where, f"GPU {ABSENT}")
    assert not hasattr(model, "hf_device_map")
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())
    for name, p in model.named_parameters():
        assert p.device.type == "cpu" and torch.equal(p, before[name])


def test_from_pretrained_refuses_before_reading_anything(tmp_path) -> None:
    pytest.importorskip("transformers")
    from x_bigmodel.transformers.pretrained import from_pretrained

    # The folder is empty: the device is refused before the missing config is even looked for.
    with pytest.raises(ValueError) as info:
        from_pretrained(tmp_path, device_map={"": ABSENT})
    assert_one_line(str(info.value), "device_map['']", f"GPU {ABSENT}")
    with pytest.raises(ValueError) as info:
        from_pretrained(tmp_path, device_map="auto", max_memory={ABSENT: "1GiB"})
    assert_one_line(str(info.value), f"max_memory[{ABSENT}]", f"GPU {ABSENT}")


def test_planning_for_another_machine_still_works() -> None:
    # Accelerate plans maps for GPUs this process lacks (with a warning); so do we.
    planned = infer_auto_device_map(meta_net(), max_memory={ABSENT: "1GiB", "cpu": "1GiB"})
    assert planned == {"": ABSENT}


def test_the_devices_here_are_listed_in_order() -> None:
    here = present_devices()
    assert here[-2:] == ("cpu", "disk")
    assert [d for d in here if isinstance(d, int)] == list(range(GPUS))
    assert re.fullmatch(r"(\d+, )*('mps', )?'cpu', 'disk'", shown_here())


@pytest.mark.parametrize("kind", ["cuda", "xpu"])
def test_gpu_indices_are_the_accelerators_devices(monkeypatch, kind) -> None:
    # On a GPU build current_accelerator() is a torch.device; a CPU-only build returns None, so
    # the device a GPU index names is checked here with the accelerator's answer stood in.
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: torch.device(kind))
    assert storage_device(0) == torch.device(kind, 0)
    assert run_device(1, torch.device(kind, 0)) == torch.device(kind, 1)
    assert run_device("disk", torch.device(kind, 0)) == torch.device(kind, 0)
    assert storage_device("cpu") == storage_device("disk") == torch.device("cpu")
    assert DevicePlan.from_map({"": 0}).main_device() == torch.device(kind, 0)


def test_bare_cuda_is_the_current_device(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert device_key("cuda") == 1
    assert device_key(torch.device("cuda")) == 1
    assert device_key("cuda:0") == 0
    assert device_key(0) == 0
