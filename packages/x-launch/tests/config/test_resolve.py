"""The effective config: flag > X_LAUNCH_<KEY> variable > config file > default, with sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from x_launch.config.file import ConfigError, load_config
from x_launch.config.launch_config import Setting
from x_launch.config.resolve import resolve
from x_launch.config.schema import SCHEMA, SECTIONS, all_fields


def typed(setting: Setting) -> tuple[str, Any, str]:
    return type(setting.value).__name__, setting.value, setting.source


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "launch.yaml"
    path.write_text(
        "distributed_type: FSDP\n"
        "num_processes: 2\n"
        "mixed_precision: bf16\n"
        "use_cpu: true\n"
        "fsdp_config:\n"
        "  fsdp_version: 1\n"
        "  fsdp_offload_params: true\n"
    )
    return path


def test_all_fields_has_top_level_and_dotted_section_keys() -> None:
    fields = all_fields()
    expected = set(SCHEMA) | {f"{section}.{key}" for section, subs in SECTIONS.items() for key in subs}
    assert set(fields) == expected
    assert fields["fsdp_config.fsdp_version"] is SECTIONS["fsdp_config"]["fsdp_version"]
    assert fields["num_processes"] is SCHEMA["num_processes"]


def test_nothing_given_means_every_default() -> None:
    settings = resolve(None, {}, {})
    assert set(settings) == set(all_fields())
    for key, field in all_fields().items():
        assert settings[key] == Setting(field.default, "default"), key
    assert typed(settings["num_processes"]) == ("int", 1, "default")
    assert typed(settings["fsdp_config.fsdp_version"]) == ("int", 2, "default")


# --- a top-level key: num_processes -----------------------------------------------------------


def test_file_beats_default(config_file: Path) -> None:
    settings = resolve(load_config(config_file), {}, {})
    source = f"config file {config_file}"
    assert typed(settings["num_processes"]) == ("int", 2, source)
    assert typed(settings["mixed_precision"]) == ("str", "bf16", source)
    assert typed(settings["use_cpu"]) == ("bool", True, source)
    assert typed(settings["num_machines"]) == ("int", 1, "default")


def test_environment_variable_beats_file(config_file: Path) -> None:
    settings = resolve(load_config(config_file), {}, {"X_LAUNCH_NUM_PROCESSES": "3"})
    assert typed(settings["num_processes"]) == ("int", 3, "X_LAUNCH_NUM_PROCESSES")
    assert typed(settings["mixed_precision"]) == ("str", "bf16", f"config file {config_file}")


def test_flag_beats_environment_variable_and_file(config_file: Path) -> None:
    settings = resolve(load_config(config_file), {"num_processes": "4"}, {"X_LAUNCH_NUM_PROCESSES": "3"})
    assert typed(settings["num_processes"]) == ("int", 4, "--num_processes")


def test_environment_variable_beats_default_without_a_file() -> None:
    settings = resolve(None, {}, {"X_LAUNCH_NUM_PROCESSES": "6"})
    assert typed(settings["num_processes"]) == ("int", 6, "X_LAUNCH_NUM_PROCESSES")


def test_reads_os_environ_when_no_mapping_is_given(config_file: Path, monkeypatch) -> None:
    monkeypatch.setenv("X_LAUNCH_NUM_PROCESSES", "5")
    assert typed(resolve(load_config(config_file))["num_processes"]) == ("int", 5, "X_LAUNCH_NUM_PROCESSES")


@pytest.mark.parametrize("blank", ["", "   "])
def test_blank_environment_variable_counts_as_unset(config_file: Path, blank: str) -> None:
    settings = resolve(load_config(config_file), {}, {"X_LAUNCH_NUM_PROCESSES": blank})
    assert typed(settings["num_processes"]) == ("int", 2, f"config file {config_file}")


def test_flag_given_as_none_counts_as_not_given(config_file: Path) -> None:
    settings = resolve(load_config(config_file), {"num_processes": None}, {})
    assert typed(settings["num_processes"]) == ("int", 2, f"config file {config_file}")


def test_false_flag_overrides_true_file_value(config_file: Path) -> None:
    settings = resolve(load_config(config_file), {"use_cpu": False}, {"X_LAUNCH_USE_CPU": "yes"})
    assert typed(settings["use_cpu"]) == ("bool", False, "--use_cpu")


def test_values_from_variables_are_canonical() -> None:
    settings = resolve(
        None, {}, {"X_LAUNCH_MIXED_PRECISION": "BF16", "X_LAUNCH_USE_CPU": "on", "X_LAUNCH_GPU_IDS": "0, 1"}
    )
    assert typed(settings["mixed_precision"]) == ("str", "bf16", "X_LAUNCH_MIXED_PRECISION")
    assert typed(settings["use_cpu"]) == ("bool", True, "X_LAUNCH_USE_CPU")
    assert typed(settings["gpu_ids"]) == ("str", "0,1", "X_LAUNCH_GPU_IDS")


# --- a section key: fsdp_config.fsdp_version ---------------------------------------------------


def test_section_key_from_file(config_file: Path) -> None:
    settings = resolve(load_config(config_file), {}, {})
    assert typed(settings["fsdp_config.fsdp_version"]) == ("int", 1, f"config file {config_file}")
    assert typed(settings["fsdp_config.fsdp_offload_params"]) == ("bool", True, f"config file {config_file}")
    assert typed(settings["fsdp_config.fsdp_state_dict_type"]) == ("str", "FULL_STATE_DICT", "default")


def test_section_key_environment_variable_beats_file(config_file: Path) -> None:
    settings = resolve(load_config(config_file), {}, {"X_LAUNCH_FSDP_VERSION": "2"})
    assert typed(settings["fsdp_config.fsdp_version"]) == ("int", 2, "X_LAUNCH_FSDP_VERSION")


def test_section_key_flag_beats_environment_variable(config_file: Path) -> None:
    settings = resolve(load_config(config_file), {"fsdp_version": 1}, {"X_LAUNCH_FSDP_VERSION": "2"})
    assert typed(settings["fsdp_config.fsdp_version"]) == ("int", 1, "--fsdp_version")


def test_section_key_environment_variable_beats_default() -> None:
    settings = resolve(None, {}, {"X_LAUNCH_ZERO_STAGE": "3", "X_LAUNCH_DYNAMO_BACKEND": "inductor"})
    assert typed(settings["deepspeed_config.zero_stage"]) == ("int", 3, "X_LAUNCH_ZERO_STAGE")
    assert typed(settings["dynamo_config.dynamo_backend"]) == ("str", "INDUCTOR", "X_LAUNCH_DYNAMO_BACKEND")


# --- invalid values from variables and flags ---------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "raw", "accepted"),
    [
        ("X_LAUNCH_NUM_PROCESSES", "0", "an integer >= 1"),
        ("X_LAUNCH_NUM_PROCESSES", "two", "an integer >= 1"),
        ("X_LAUNCH_MIXED_PRECISION", "fp32", "one of no, fp16, bf16, fp8"),
        ("X_LAUNCH_USE_CPU", "maybe", "true or false"),
        ("X_LAUNCH_FSDP_VERSION", "3", "an integer from 1 to 2"),
        ("X_LAUNCH_MAIN_PROCESS_PORT", "70000", "an integer from 0 to 65535"),
    ],
)
def test_invalid_environment_value_is_a_config_error_naming_the_variable(
    config_file: Path, variable: str, raw: str, accepted: str
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(load_config(config_file), {}, {variable: raw})
    assert str(info.value) == f"{variable}: {raw!r} is not valid: expected {accepted}"


def test_invalid_flag_value_is_a_config_error_naming_the_flag() -> None:
    with pytest.raises(ConfigError) as info:
        resolve(None, {"num_processes": "0"}, {})
    assert str(info.value) == "--num_processes: '0' is not valid: expected an integer >= 1"


def test_invalid_variable_is_not_reported_when_a_flag_overrides_it() -> None:
    settings = resolve(None, {"num_processes": 2}, {"X_LAUNCH_NUM_PROCESSES": "0"})
    assert typed(settings["num_processes"]) == ("int", 2, "--num_processes")


def _deepspeed_file(tmp_path: Path, kind: str = "DEEPSPEED", top: str = "") -> Path:
    path = tmp_path / "ds.yaml"
    path.write_text(
        f"distributed_type: {kind}\nnum_processes: 2\n{top}"
        "deepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 4\n"
    )
    return path


def test_a_deepspeed_sections_accumulation_is_the_runs(tmp_path: Path) -> None:
    # accelerate launch exports it as ACCELERATE_GRADIENT_ACCUMULATION_STEPS (side by side:
    # integration-tests/test_accelerate_env.py); it was once read and then dropped here.
    path = _deepspeed_file(tmp_path)
    settings = resolve(load_config(path), {}, {})
    assert typed(settings["gradient_accumulation_steps"]) == ("int", 4, f"config file {path} (deepspeed_config)")
    flagged = resolve(load_config(path), {"gradient_accumulation_steps": "2"}, {})
    assert typed(flagged["gradient_accumulation_steps"]) == ("int", 2, "--gradient_accumulation_steps")


def test_the_top_level_accumulation_beats_the_deepspeed_sections(tmp_path: Path) -> None:
    path = _deepspeed_file(tmp_path, top="gradient_accumulation_steps: 8\n")
    assert resolve(load_config(path), {}, {})["gradient_accumulation_steps"].value == 8


def test_a_deepspeed_section_without_deepspeed_leaves_the_accumulation_alone(tmp_path: Path) -> None:
    settings = resolve(load_config(_deepspeed_file(tmp_path, kind="MULTI_GPU")), {}, {})
    assert typed(settings["gradient_accumulation_steps"]) == ("int", 1, "default")
