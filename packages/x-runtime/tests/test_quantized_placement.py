"""8-bit/4-bit (bitsandbytes) models at prepare: placements training cannot use fail in one line."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from x_runtime import Accelerator
from x_runtime.accelerator import quantized
from x_runtime.accelerator.quantized import check_quantized_placement

CPU = torch.device("cpu")


def quantized_model(device_map: dict[str, Any], bits: int = 8) -> torch.nn.Module:
    model = torch.nn.Linear(2, 2)
    setattr(model, f"is_loaded_in_{bits}bit", True)
    model.hf_device_map = device_map
    return model


@pytest.mark.parametrize("bits", [8, 4])
def test_prepare_refuses_cpu_offload_with_a_value_error(bits: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantized, "_bnb_computes_on_cpu", lambda: False)
    accelerator = Accelerator(cpu=True)
    with pytest.raises(
        ValueError,
        match=r"^a model loaded in 8-bit or 4-bit precision cannot be trained with CPU or disk offload \(its hf_device_map holds cpu\);",
    ):
        accelerator.prepare_model(quantized_model({"": "cpu"}, bits))


def test_disk_offload_is_refused_even_where_bitsandbytes_runs_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantized, "_bnb_computes_on_cpu", lambda: True)
    monkeypatch.setattr(quantized, "is_xpu_available", lambda: False)
    with pytest.raises(ValueError, match=r"holds disk\);"):
        check_quantized_placement(quantized_model({"a": "cpu", "b": "disk"}), device=CPU, distributed=False)
    check_quantized_placement(quantized_model({"": "cpu"}), device=CPU, distributed=False)  # multi-backend: fine


def test_several_devices_only_without_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    model = quantized_model({"a": 0, "b": 1})
    check_quantized_placement(model, device=torch.device("cuda", 0), distributed=False)
    with pytest.raises(
        ValueError, match=r"spread over several devices in a distributed run \(its hf_device_map holds 0, 1\)"
    ):
        check_quantized_placement(model, device=torch.device("cuda", 0), distributed=True)


def test_the_model_must_sit_on_the_training_device() -> None:
    with pytest.raises(
        ValueError, match=r"^a model loaded in 8-bit or 4-bit precision on 1 cannot be trained on cuda:0;"
    ):
        check_quantized_placement(quantized_model({"": 1}), device=torch.device("cuda", 0), distributed=False)
    # the first GPU trains on a device given without an index, as in Accelerate
    check_quantized_placement(quantized_model({"": 0}), device=torch.device("cuda"), distributed=False)


def test_plain_models_and_models_without_a_device_map_pass() -> None:
    plain = torch.nn.Linear(2, 2)
    plain.hf_device_map = {"": "disk"}
    check_quantized_placement(plain, device=CPU, distributed=True)
    check_quantized_placement(quantized_model({}), device=CPU, distributed=True)
