"""DeepSpeed configuration without DeepSpeed: "auto" values, contradictions, the install hint."""

from __future__ import annotations

import importlib.util
import json

import pytest

from x_common import env
from x_runtime import Accelerator, DeepSpeedPlugin
from x_runtime.strategies.deepspeed import fill_auto_values

FILL = {"micro_batch": 8, "accumulation": 2, "world_size": 4, "mixed_precision": "bf16", "clipping": None}


def _config(**extra) -> dict:
    base = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
    }
    base.update(extra)
    return base


def test_auto_values_come_from_the_prepared_objects() -> None:
    config = _config()
    steps = fill_auto_values(config, **FILL, hidden_size=64)
    assert steps == 2
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert config["train_batch_size"] == 8 * 2 * 4
    assert config["gradient_clipping"] == 1.0
    assert config["bf16"] == {"enabled": True}
    zero = config["zero_optimization"]
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (4096, 3686)
    assert zero["stage3_param_persistence_threshold"] == 640


def test_size_autos_without_a_hidden_size_fall_back_to_deepspeeds_defaults() -> None:
    config = _config()
    fill_auto_values(config, **FILL, hidden_size=None)
    assert "reduce_bucket_size" not in config["zero_optimization"]


def test_accumulation_from_the_config_is_adopted_when_the_accelerator_has_none() -> None:
    config = _config(gradient_accumulation_steps=4)
    assert fill_auto_values(config, **{**FILL, "accumulation": 1}, hidden_size=None) == 4
    assert config["train_batch_size"] == 8 * 4 * 4


@pytest.mark.parametrize(
    ("extra", "fill", "message"),
    [
        (
            {"gradient_accumulation_steps": 4},
            {},
            "the DeepSpeed config says gradient_accumulation_steps=4 but the Accelerator has "
            "gradient_accumulation_steps=2",
        ),
        (
            {"train_micro_batch_size_per_gpu": 16},
            {},
            "the DeepSpeed config says train_micro_batch_size_per_gpu=16 but the prepared dataloader gives 8 samples",
        ),
        (
            {"train_batch_size": 32},
            {},
            "the DeepSpeed config says train_batch_size=32 but 8 per process x 2 accumulation steps x 4 processes = 64",
        ),
        (
            {"bf16": {"enabled": True}},
            {"mixed_precision": "no"},
            "the DeepSpeed config says bf16.enabled=true but the Accelerator has mixed_precision='no'",
        ),
        (
            {"fp16": {"enabled": False}},
            {"mixed_precision": "fp16"},
            "the DeepSpeed config says fp16.enabled=false but the Accelerator has mixed_precision='fp16'",
        ),
        ({}, {"micro_batch": None}, 'train_micro_batch_size_per_gpu is "auto" but no dataloader was prepared'),
    ],
)
def test_contradictions_name_both_values(extra, fill, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        fill_auto_values(_config(**extra), **{**FILL, **fill}, hidden_size=None)


def test_plugin_builds_a_config_from_its_fields_and_the_launcher(monkeypatch) -> None:
    monkeypatch.setenv(env.DEEPSPEED_ZERO_STAGE.name, "3")
    monkeypatch.setenv(env.DEEPSPEED_GRADIENT_CLIPPING.name, "0.5")
    plugin = DeepSpeedPlugin(offload_optimizer_device="cpu")
    assert plugin.config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert (plugin.zero_stage, plugin.gradient_clipping, plugin.config["gradient_clipping"]) == (3, 0.5, "auto")


def test_plugin_reads_a_json_file_and_refuses_a_contradicting_stage(tmp_path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": "auto"}))
    assert DeepSpeedPlugin(hf_ds_config=str(path)).zero_stage == 1
    with pytest.raises(ValueError, match=r"config says zero_optimization\.stage=1 but zero_stage=3; make them agree"):
        DeepSpeedPlugin(hf_ds_config=str(path), zero_stage=3)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"ds.json, line 1: not valid JSON"):
        DeepSpeedPlugin(hf_ds_config=str(path))
    with pytest.raises(ValueError, match=r"nowhere\.json does not exist; give a JSON file or a dict"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "nowhere.json"))


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="checks the message without DeepSpeed")
def test_deepspeed_missing_gives_the_install_command(monkeypatch) -> None:
    monkeypatch.setenv(env.DISTRIBUTED_TYPE.name, "DEEPSPEED")
    with pytest.raises(ValueError) as caught:
        Accelerator(cpu=True)
    assert str(caught.value) == (
        "distributed_type DEEPSPEED needs DeepSpeed, which is not installed: pip install 'x-runtime[deepspeed]'"
    )
