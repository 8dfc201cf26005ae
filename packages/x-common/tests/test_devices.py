"""Device discovery: the CPU everywhere, CUDA where there is one."""

from __future__ import annotations

import dataclasses
import importlib.util
import platform
from pathlib import Path

import pytest

from x_common.devices import BACKENDS, Device, available_backends, device_count, list_devices
from x_common.host_memory import host_memory
from x_common.nvml import nvml_memory

UNKNOWN = "expected one of cuda, xpu, mps, xla, cpu"


def expected_cpu_name() -> str:
    """The first "model name" of /proc/cpuinfo where there is one, else what platform says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def test_backends_in_order_of_preference() -> None:
    assert BACKENDS == ("cuda", "xpu", "mps", "xla", "cpu")


def test_cpu_is_always_available_and_last() -> None:
    backends = available_backends()
    assert backends[-1] == "cpu"
    assert backends.count("cpu") == 1
    assert list(backends) == [b for b in BACKENDS if b in backends]  # preference order kept


def test_available_backends_are_exactly_those_with_devices() -> None:
    assert available_backends() == tuple(b for b in BACKENDS if device_count(b) > 0)


def test_cpu_count() -> None:
    assert device_count("cpu") == 1


def test_cuda_count_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert device_count("cuda") == expected
    assert ("cuda" in available_backends()) is (expected > 0)
    assert len(list_devices("cuda")) == expected


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed")
def test_no_xla_without_torch_xla() -> None:
    assert device_count("xla") == 0
    assert list_devices("xla") == []


@pytest.mark.parametrize("backend", ["gpu", "tpu", "CPU", "cuda:0", ""])
def test_unknown_backend(backend: str) -> None:
    for call in (device_count, list_devices):
        with pytest.raises(ValueError) as excinfo:
            call(backend)
        assert str(excinfo.value) == f"unknown backend {backend!r}; {UNKNOWN}"


def test_cpu_device_reports_host_memory() -> None:
    [device] = list_devices("cpu")
    memory = host_memory()
    assert device.backend == "cpu"
    assert device.index == 0
    assert device.torch_device == "cpu:0"
    assert device.name == expected_cpu_name()
    assert device.name
    assert device.total_memory == memory.total
    # available RAM moves between two reads; allow a little drift
    if memory.available is None:
        assert device.free_memory is None
    else:
        assert device.free_memory is not None
        assert abs(device.free_memory - memory.available) <= 0.05 * memory.total
        assert 0 <= device.free_memory <= memory.machine_total


def test_all_devices_follow_backend_order() -> None:
    devices = list_devices()
    assert [d.backend for d in devices] == [b for b in available_backends() for _ in range(device_count(b))]
    assert devices[-1].backend == "cpu"
    for backend in available_backends():
        assert [d.index for d in devices if d.backend == backend] == list(range(device_count(backend)))


def test_device_is_frozen_and_names_its_torch_device() -> None:
    device = Device("cuda", 3, "X", 10, 5)
    assert device.torch_device == "cuda:3"
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.index = 0  # type: ignore[misc]


def test_nvml_unknown_bus_ids() -> None:
    # without NVML: {}; with it: a bus id no GPU sits on is left out
    assert nvml_memory([]) == {}
    assert nvml_memory(["0000ffff:ff:1f.0"]) == {}


# --- on a machine with CUDA ----------------------------------------------------------------


@pytest.mark.requires_cuda(1)
def test_cuda_devices_match_torch() -> None:
    import torch

    devices = list_devices("cuda")
    assert len(devices) == torch.cuda.device_count() == device_count("cuda")
    for index, device in enumerate(devices):
        assert device.backend == "cuda"
        assert device.index == index
        assert device.torch_device == f"cuda:{index}"
        assert device.name == torch.cuda.get_device_name(index)
        assert device.total_memory is not None
        assert device.free_memory is not None
        assert device.total_memory >= device.free_memory > 0


@pytest.mark.requires_cuda(1)
def test_cuda_free_memory_agrees_with_torch() -> None:
    import torch

    for device in list_devices("cuda"):
        free, total = torch.cuda.mem_get_info(device.index)
        assert device.free_memory is not None
        assert device.total_memory is not None
        assert abs(device.free_memory - free) <= 0.05 * free
        assert abs(device.total_memory - total) <= 0.05 * total


@pytest.mark.requires_cuda(1)
def test_nvml_finds_every_cuda_device_when_present() -> None:
    import torch

    from x_common.devices import _pci_bus_id

    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    bus_ids = [_pci_bus_id(p) for p in props]
    found = nvml_memory([b for b in bus_ids if b is not None])
    if not found:
        pytest.skip("NVML (libnvidia-ml.so.1) is not loadable here")
    for prop, bus_id in zip(props, bus_ids, strict=True):
        free, total = found[bus_id]
        assert total >= free > 0
        assert abs(total - prop.total_memory) <= 0.05 * prop.total_memory


@pytest.mark.requires_cuda(1)
def test_nvml_compute_capabilities_match_torchs() -> None:
    import torch

    from x_common.nvml import nvml_compute_capabilities

    visible = sorted(torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))
    found = nvml_compute_capabilities()
    # NVML sees every GPU of the machine; the visible ones are among them.
    assert all(found.count(cap) >= visible.count(cap) for cap in set(visible)), (found, visible)


def test_nvml_compute_capabilities_is_empty_without_nvidia_gpus() -> None:
    from x_common.nvml import nvml_compute_capabilities

    if device_count("cuda") == 0:
        assert nvml_compute_capabilities() == []
