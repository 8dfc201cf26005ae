"""``--plan --write-config FILE``: the plan's cheapest row as a launch config, written whole or not at all.

What x-launch makes of the file (a dry run and a real two-process run) is checked in
integration-tests/test_plan_to_launch.py, where every package is installed.
"""

from __future__ import annotations

import pytest
import yaml

from x_estimate.plan.config import launch_settings
from x_estimate.plan.search import MARGIN, Setting

MIB = 1 << 20
PLAN = ("--plan", "--seq-len", "64", "--batch-size", "2")


@pytest.fixture
def llama(model_dir, configs):
    return model_dir(configs.llama())


def _setting(shard="none", offload="none", checkpointing=False, precision="mixed-bf16", micro=4, accumulation=1):
    return Setting(precision, shard, offload, checkpointing, micro, accumulation)


@pytest.mark.parametrize(
    ("setting", "gpus", "expected"),
    [
        (_setting(), 1, {"distributed_type": "NO", "mixed_precision": "bf16"}),
        (_setting(accumulation=4), 8, {"distributed_type": "MULTI_GPU", "gradient_accumulation_steps": 4}),
        (_setting("zero3", accumulation=2), 8, {"distributed_type": "FSDP", "gradient_accumulation_steps": 2}),
        (_setting("zero1"), 8, {"distributed_type": "DEEPSPEED", "deepspeed_config": {
            "zero_stage": 1, "offload_optimizer_device": "none", "offload_param_device": "none",
            "gradient_accumulation_steps": 1, "zero3_init_flag": False}}),
        (_setting("zero2"), 8, {"distributed_type": "FSDP", "fsdp_config": {
            "fsdp_version": 2, "fsdp_reshard_after_forward": False, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": "Block", "fsdp_offload_params": False,
            "fsdp_activation_checkpointing": False, "fsdp_state_dict_type": "SHARDED_STATE_DICT"}}),
        (_setting("zero3", checkpointing=True), 8, {"fsdp_config": {
            "fsdp_version": 2, "fsdp_reshard_after_forward": True, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": "Block", "fsdp_offload_params": False,
            "fsdp_activation_checkpointing": True, "fsdp_state_dict_type": "SHARDED_STATE_DICT"}}),
        (_setting("zero3", "params"), 2, {"distributed_type": "FSDP"}),
        (_setting("zero3", "optimizer", accumulation=2), 2, {"distributed_type": "DEEPSPEED", "deepspeed_config": {
            "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "none",
            "gradient_accumulation_steps": 2, "zero3_init_flag": True}}),
        (_setting(precision="bf16"), 2, {"distributed_type": "MULTI_GPU", "mixed_precision": "no"}),
        (_setting("zero2", "optimizer", precision="bf16"), 2, {"mixed_precision": "bf16"}),
    ],
)  # fmt: skip
def test_each_kind_of_row_becomes_accelerates_keys(setting, gpus, expected) -> None:
    settings = launch_settings(setting, gpus, ["Block"])
    assert settings["num_processes"] == gpus and settings["use_cpu"] is False
    assert {key: settings[key] for key in expected} == expected
    # Where Accelerate keeps it (DeepSpeed's section), or nowhere when it is 1: only then at the top.
    top = settings.get("gradient_accumulation_steps")
    assert top == (setting.accumulation if setting.accumulation > 1 and "deepspeed_config" not in settings else None)
    if setting.offload == "params":
        assert settings["fsdp_config"]["fsdp_offload_params"] is True
        assert settings["fsdp_config"]["fsdp_reshard_after_forward"] is True


def test_a_model_without_blocks_is_one_fsdp_unit() -> None:
    fsdp = launch_settings(_setting("zero3"), 4, [])["fsdp_config"]
    assert fsdp["fsdp_auto_wrap_policy"] == "NO_WRAP" and "fsdp_transformer_layer_cls_to_wrap" not in fsdp


def test_the_file_holds_row_one_and_its_figures(cli, llama, tmp_path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "plan.yaml"
    result = cli(llama, *PLAN, "--gpus", "2", "--gpu-memory", "80GiB", "--write-config", target, "--json")
    assert result.code == 0, result.err
    row = result.json["rows"][0]
    assert result.json["config_file"] == str(target)
    text = target.read_text()
    written = yaml.safe_load(text)
    assert written["mixed_precision"] == "bf16" and written["distributed_type"] == "MULTI_GPU"
    assert (written["num_processes"], written.get("gradient_accumulation_steps", 1)) == (2, row["accumulation"])
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert f"# Setting: mixed-bf16, sharding none, offload none, activation checkpointing off, micro-batch " \
           f"{row['micro_batch']} x {row['accumulation']} accumulation steps." in comments  # fmt: skip
    assert [p.name for p in folder.iterdir()] == ["plan.yaml"]  # no staging file left beside it
    table = cli(llama, *PLAN, "--gpus", "2", "--gpu-memory", "80GiB", "--write-config", folder / "b.yaml")
    assert f"- Row 1 written to {folder / 'b.yaml'} as a launch config: x-launch --config_file" in table.out
    assert (folder / "b.yaml").read_text() == text.replace(str(target), str(folder / "b.yaml"))


def test_an_existing_file_is_kept_unless_overwrite(cli, llama, tmp_path) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("num_processes: 3\n")
    result = cli(llama, *PLAN, "--gpu-memory", "80GiB", "--write-config", target)
    assert result.code == 2 and target.read_text() == "num_processes: 3\n"
    assert f"--write-config {target}: the file exists; pass --overwrite to replace it" in result.err
    assert "Traceback" not in result.err
    result = cli(llama, *PLAN, "--gpu-memory", "80GiB", "--write-config", target, "--overwrite")
    assert result.code == 0, result.err
    assert yaml.safe_load(target.read_text())["distributed_type"] == "NO"


def test_nothing_fits_writes_nothing_and_fails(cli, llama, tmp_path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "plan.yaml"
    result = cli(llama, *PLAN, "--gpu-memory", f"{MARGIN + 2 * MIB}B", "--write-config", target)
    assert result.code == 1
    assert "Nothing fits in 2.00 MiB per GPU" in result.out
    assert result.err.strip() == f"Error: nothing fits 1 x 1.00 GiB: no config written to {target}"
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--seq-len", "64", "--write-config", "c.yaml"),
            "--write-config writes the cheapest row of a plan: add --plan",
        ),
        ((*PLAN, "--gpu-memory", "80GiB", "--write-config", "missing/c.yaml"), "the folder missing does not exist"),
    ],
)
def test_bad_write_config_options_are_one_line_and_exit_2(cli, llama, args, message) -> None:
    result = cli(llama, *args)
    assert result.code == 2 and message in result.err and "Traceback" not in result.err
