"""Reading, finding and writing the launch config file: Accelerate's files load unchanged,
errors point at the line, and an existing file is never clobbered."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from x_launch.config.file import (
    ConfigError,
    accelerate_config_path,
    as_yaml_document,
    default_config_path,
    find_config,
    load_config,
    save_config,
)


def typed(values: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """{key: (type name, value)}: makes ``True == 1`` and ``2 == 2.0`` count as different."""
    return {key: (type(value).__name__, value) for key, value in values.items()}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


# --- Accelerate's files, as `accelerate config` writes them (keys sorted, YAML 1.1) -----------

MULTI_GPU = """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

FSDP2 = """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

DEEPSPEED = """
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 4
  gradient_clipping: 1.0
  offload_optimizer_device: cpu
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
distributed_type: DEEPSPEED
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

# Accelerate's documentation example: two machines, dynamo and a parallelism_config section.
DYNAMO_MULTI_NODE = """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
dynamo_config:
  dynamo_backend: TENSORRT
  dynamo_mode: max-autotune
  dynamo_use_dynamic: true
  dynamo_use_fullgraph: true
  dynamo_use_regional_compilation: true
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: true
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
machine_rank: 0
main_process_ip: 192.168.1.1
main_process_port: 7878
main_training_function: main
mixed_precision: bf16
num_machines: 2
num_processes: 4
parallelism_config:
  parallelism_config_cp_comm_strategy: allgather
  parallelism_config_cp_size: 512
  parallelism_config_dp_replicate_size: 2
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

# What `accelerate config default` (write_basic_config) writes: JSON, in default_config.yaml.
ACCELERATE_DEFAULT_JSON = """
{
  "compute_environment": "LOCAL_MACHINE",
  "debug": false,
  "distributed_type": "NO",
  "downcast_bf16": false,
  "enable_cpu_affinity": false,
  "machine_rank": 0,
  "main_training_function": "main",
  "mixed_precision": "bf16",
  "num_machines": 1,
  "num_processes": 1,
  "rdzv_backend": "static",
  "same_network": false,
  "tpu_use_cluster": false,
  "tpu_use_sudo": false,
  "use_cpu": true
}
"""

# `accelerate config` with FSDP version 1 (Accelerate >= 1.6): the sharding strategy is stored
# under fsdp_reshard_after_forward, as a strategy name.
FSDP1 = """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_reshard_after_forward: FULL_SHARD
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_use_orig_params: true
  fsdp_version: 1
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

ACCELERATE_IGNORED = [
    "enable_cpu_affinity",
    "same_network",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
]

COMMON = {
    "compute_environment": "LOCAL_MACHINE",
    "debug": False,
    "downcast_bf16": False,  # a setting now (--downcast_bf16 on TPU), no longer ignored
    "machine_rank": 0,
    "main_training_function": "main",
}


def test_accelerate_multi_gpu_config_loads_unchanged(tmp_path: Path) -> None:
    path = write(tmp_path / "hf" / "accelerate" / "default_config.yaml", MULTI_GPU)
    loaded = load_config(path)
    assert loaded.path == path
    assert typed(loaded.values) == typed(
        {
            **COMMON,
            "distributed_type": "MULTI_GPU",
            "gpu_ids": "all",
            "mixed_precision": "bf16",
            "num_machines": 1,
            "num_processes": 2,
            "rdzv_backend": "static",
            "use_cpu": False,
        }
    )
    assert loaded.ignored == ACCELERATE_IGNORED


def test_accelerate_fsdp2_config_loads_unchanged(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path / "fsdp.yaml", FSDP2))
    assert typed(loaded.values) == typed(
        {
            **COMMON,
            "distributed_type": "FSDP",
            "fsdp_config.fsdp_activation_checkpointing": False,
            "fsdp_config.fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_config.fsdp_cpu_ram_efficient_loading": True,
            "fsdp_config.fsdp_offload_params": False,
            "fsdp_config.fsdp_reshard_after_forward": True,
            "fsdp_config.fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_config.fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
            "fsdp_config.fsdp_version": 2,
            "mixed_precision": "bf16",
            "num_machines": 1,
            "num_processes": 8,
            "rdzv_backend": "static",
            "use_cpu": False,
        }
    )
    assert loaded.ignored == ACCELERATE_IGNORED


def test_accelerate_deepspeed_config_loads_unchanged(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path / "ds.yaml", DEEPSPEED))
    assert typed(loaded.values) == typed(
        {
            **COMMON,
            "deepspeed_config.gradient_accumulation_steps": 4,
            "deepspeed_config.gradient_clipping": 1.0,
            "deepspeed_config.offload_optimizer_device": "cpu",
            "deepspeed_config.offload_param_device": "none",
            "deepspeed_config.zero3_init_flag": False,
            "deepspeed_config.zero_stage": 2,
            "distributed_type": "DEEPSPEED",
            "mixed_precision": "bf16",
            "num_machines": 1,
            "num_processes": 2,
            "rdzv_backend": "static",
            "use_cpu": False,
        }
    )
    assert loaded.ignored == ACCELERATE_IGNORED


def test_accelerate_dynamo_multi_node_config_loads_unchanged(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path / "dynamo.yaml", DYNAMO_MULTI_NODE))
    values = loaded.values
    assert typed({k: v for k, v in values.items() if k.startswith("dynamo_config.")}) == typed(
        {
            "dynamo_config.dynamo_backend": "TENSORRT",
            "dynamo_config.dynamo_mode": "max-autotune",
            "dynamo_config.dynamo_use_dynamic": True,
            "dynamo_config.dynamo_use_fullgraph": True,
            "dynamo_config.dynamo_use_regional_compilation": True,
        }
    )
    assert typed({k: values[k] for k in ("main_process_ip", "main_process_port", "num_machines", "num_processes")}) == (
        typed({"main_process_ip": "192.168.1.1", "main_process_port": 7878, "num_machines": 2, "num_processes": 4})
    )
    assert values["fsdp_config.fsdp_offload_params"] is True
    assert {k: v for k, v in values.items() if k.startswith("parallelism_config")} == {
        "parallelism_config.parallelism_config_cp_comm_strategy": "allgather",
        "parallelism_config.parallelism_config_cp_size": 512,
        "parallelism_config.parallelism_config_dp_replicate_size": 2,
        "parallelism_config.parallelism_config_dp_shard_size": 2,
        "parallelism_config.parallelism_config_tp_size": 2,
    }
    assert loaded.ignored == [
        "enable_cpu_affinity",
        "same_network",
        "tpu_env",
        "tpu_use_cluster",
        "tpu_use_sudo",
    ]


def test_json_written_into_a_yaml_file_loads(tmp_path: Path) -> None:
    path = write(tmp_path / "hf" / "accelerate" / "default_config.yaml", ACCELERATE_DEFAULT_JSON)
    assert json.loads(path.read_text())["use_cpu"] is True  # really JSON
    loaded = load_config(path)
    assert typed(loaded.values) == typed(
        {
            **COMMON,
            "distributed_type": "NO",
            "mixed_precision": "bf16",
            "num_machines": 1,
            "num_processes": 1,
            "rdzv_backend": "static",
            "use_cpu": True,
        }
    )
    assert loaded.ignored == [
        "enable_cpu_affinity",
        "same_network",
        "tpu_use_cluster",
        "tpu_use_sudo",
    ]


def test_error_in_a_json_config_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "default_config.yaml", '{\n  "debug": false,\n  "num_proceses": 2\n}\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}, line 3: unknown key 'num_proceses'" in str(info.value)
    assert "did you mean 'num_processes'?" in str(info.value)


def test_accelerate_fsdp1_config_loads(tmp_path: Path) -> None:
    # `accelerate config` (Accelerate >= 1.6) writes FSDP1's sharding strategy as
    # `fsdp_reshard_after_forward: FULL_SHARD`; Accelerate's own FSDP1 plugin rejects a bool
    # there. The file must load, and the strategy must not be lost.
    loaded = load_config(write(tmp_path / "fsdp1.yaml", FSDP1))
    assert loaded.values["fsdp_config.fsdp_version"] == 1
    assert "FULL_SHARD" in (
        loaded.values.get("fsdp_config.fsdp_reshard_after_forward"),
        loaded.values.get("fsdp_config.fsdp_sharding_strategy"),
    )


def test_legacy_top_level_dynamo_backend_loads(tmp_path: Path) -> None:
    # Accelerate 0.15-0.17 wrote `dynamo_backend` at the top level; Accelerate still reads such
    # files (ClusterConfig.process_config moves it into dynamo_config).
    text = MULTI_GPU.replace("downcast_bf16: 'no'\n", "downcast_bf16: 'no'\ndynamo_backend: 'NO'\n")
    loaded = load_config(write(tmp_path / "old.yaml", text))
    assert loaded.values["num_processes"] == 2
    assert loaded.values.get("dynamo_config.dynamo_backend", "NO") == "NO"


@pytest.mark.parametrize(
    "text",
    [MULTI_GPU, FSDP2, DEEPSPEED, DYNAMO_MULTI_NODE, ACCELERATE_DEFAULT_JSON, FSDP1],
    ids=["multi-gpu", "fsdp2", "deepspeed", "dynamo", "json", "fsdp1"],
)
def test_the_fixture_files_are_ones_accelerate_itself_reads(tmp_path: Path, text: str) -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    path = write(tmp_path / "acc.yaml", text)
    config = config_args.ClusterConfig.from_yaml_file(path)
    assert config.num_processes == yaml.safe_load(path.read_text())["num_processes"]


def test_files_written_by_accelerates_own_writers_load(tmp_path: Path) -> None:
    accelerate_utils = pytest.importorskip("accelerate.utils")
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    basic = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    assert accelerate_utils.write_basic_config(mixed_precision="fp16", save_location=str(basic))
    assert basic.read_text().lstrip().startswith("{")
    loaded = load_config(basic)
    assert loaded.values["mixed_precision"] == "fp16"
    assert loaded.values["compute_environment"] == "LOCAL_MACHINE"
    assert loaded.values["main_training_function"] == "main"  # used by x-launch --tpu

    written = tmp_path / "ds.yaml"
    config_args.ClusterConfig(
        compute_environment="LOCAL_MACHINE",
        distributed_type="DEEPSPEED",
        mixed_precision="no",
        use_cpu=False,
        debug=False,
        num_processes=4,
        deepspeed_config={
            "zero_stage": 3,
            "offload_optimizer_device": "none",
            "offload_param_device": "cpu",
            "zero3_init_flag": True,
            "zero3_save_16bit_model": True,
        },
        dynamo_config={"dynamo_backend": "NO"},
    ).to_yaml_file(written)
    loaded = load_config(written)
    assert typed({k: v for k, v in loaded.values.items() if "." in k}) == typed(
        {
            "deepspeed_config.offload_optimizer_device": "none",
            "deepspeed_config.offload_param_device": "cpu",
            "deepspeed_config.zero3_init_flag": True,
            "deepspeed_config.zero3_save_16bit_model": True,
            "deepspeed_config.zero_stage": 3,
            "dynamo_config.dynamo_backend": "NO",
        }
    )
    assert loaded.values["mixed_precision"] == "no"
    assert loaded.values["num_processes"] == 4


# --- errors name the file and the line ---------------------------------------------------------


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_unknown_top_level_key_names_file_line_and_nearest_key(tmp_path: Path) -> None:
    path = write(
        tmp_path / "launch.yaml",
        """
        compute_environment: LOCAL_MACHINE
        distributed_type: MULTI_GPU
        num_proceses: 2
        """,
    )
    message = load_error(path)
    assert str(path) in message
    assert "line 3" in message
    assert "unknown key 'num_proceses'" in message
    assert "did you mean 'num_processes'?" in message


def test_unknown_key_without_a_near_match_has_no_suggestion(tmp_path: Path) -> None:
    message = load_error(write(tmp_path / "launch.yaml", "num_processes: 2\nzzzz: 1\n"))
    assert message.endswith(", line 2: unknown key 'zzzz'")


def test_unknown_key_inside_fsdp_config_names_line_and_suggests(tmp_path: Path) -> None:
    path = write(
        tmp_path / "launch.yaml",
        """
        distributed_type: FSDP
        fsdp_config:
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_verison: 2
        num_processes: 2
        """,
    )
    message = load_error(path)
    assert message.startswith(f"{path}, line 4: ")
    assert "unknown key 'fsdp_verison' in fsdp_config" in message
    assert "did you mean 'fsdp_version'?" in message


def test_unknown_section_key_without_a_near_match_lists_the_valid_keys(tmp_path: Path) -> None:
    message = load_error(write(tmp_path / "launch.yaml", "deepspeed_config:\n  zero_stage: 2\n  qqq: 1\n"))
    assert ", line 3: unknown key 'qqq' in deepspeed_config; valid keys: deepspeed_config_file, zero_stage," in message


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (
            "mixed_precision: bf16\nnum_processes: 0\n",
            2,
            "num_processes: 0 is not valid: expected an integer >= 1",
        ),
        ("main_process_port: 70000\n", 1, "main_process_port: 70000 is not valid: expected an integer from 0 to 65535"),
        (
            "debug: false\n\nmixed_precision: fp32\n",
            3,
            "mixed_precision: 'fp32' is not valid: expected one of no, fp16, bf16, fp8",
        ),
        (
            "distributed_type: bogus\n",
            1,
            "distributed_type: 'bogus' is not valid: expected one of NO, MULTI_CPU, MULTI_GPU, MULTI_XPU, FSDP, DEEPSPEED, XLA",
        ),
        ("num_processes: 2\nuse_cpu: 'maybe'\n", 2, "use_cpu: 'maybe' is not valid: expected true or false"),
        (
            "gpu_ids: 'a,b'\n",
            1,
            "gpu_ids: 'a,b' is not valid: expected 'all' or comma-separated GPU indices such as 0,1",
        ),
        (
            "distributed_type: DEEPSPEED\ndeepspeed_config:\n  offload_optimizer_device: cpu\n  zero_stage: 4\n",
            4,
            "deepspeed_config.zero_stage: 4 is not valid: expected an integer from 0 to 3",
        ),
        (
            "fsdp_config:\n  fsdp_version: 3\n",
            2,
            "fsdp_config.fsdp_version: 3 is not valid: expected an integer from 1 to 2",
        ),
        ("fsdp_config: 3\n", 1, "fsdp_config must be a mapping of keys, not 3"),
        (
            "deepspeed_config:\n  zero_stage: 2\n  gradient_clipping: [1.0]\n",
            3,
            "deepspeed_config.gradient_clipping: [1.0] is not valid: expected a number >= 0",
        ),
    ],
    ids=[
        "num_processes-0",
        "port-70000",
        "mixed_precision-fp32",
        "distributed_type-bogus",
        "use_cpu-maybe",
        "gpu_ids-a,b",
        "zero_stage-4",
        "fsdp_version-3",
        "section-not-mapping",
        "gradient_clipping-list",
    ],
)
def test_invalid_value_names_file_line_and_accepted_values(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path / "launch.yaml", text)
    with pytest.raises(ConfigError) as info:  # a ConfigError, not a TypeError or a traceback
        load_config(path)
    assert str(info.value) == f"{path}, line {line}: {fragment}"


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("num_processes: [2\nuse_cpu: true\n", "line 2, column 8", "expected ',' or ']'"),
        ("num_processes: 2\n  use_cpu: true\n", "line 2, column 10", "mapping values are not allowed here"),
        ("fsdp_config:\n\tfsdp_version: 2\n", "line 2, column 1", "found character '\\t' that cannot start any token"),
        ('{"num_processes": 2,\n "use_cpu": true\n', "line 3, column 1", "expected ',' or '}'"),
    ],
    ids=["unbalanced-bracket", "bad-indentation", "tab", "unclosed-json"],
)
def test_malformed_yaml_names_line_and_column(tmp_path: Path, text: str, where: str, problem: str) -> None:
    path = write(tmp_path / "launch.yaml", text)
    message = load_error(path)
    assert message.startswith(f"cannot parse config file {path}: {where}: ")
    assert problem in message


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("- num_processes: 2\n- use_cpu: true\n", "a list"),
        ("just some words\n", "a string ('just some words')"),
        ("42\n", "a number (42)"),
        ("yes\n", "a boolean (True)"),
    ],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = write(tmp_path / "launch.yaml", text)
    assert load_error(path) == (
        f"config file {path} must hold key: value pairs, not {kind}; write one key: value per line, e.g. num_processes: 2"
    )


def test_missing_file_says_how_to_create_one(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "launch.yaml"
    assert load_error(path) == f"config file {path} does not exist; create one with: x-launch config default"


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path / "launch.yaml", "num_processes: 2\n")
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running as root: a mode-000 file is still readable")
        message = load_error(path)
    finally:
        path.chmod(0o644)
    assert message.startswith(f"cannot read config file {path}: ")
    assert "Permission denied" in message


def test_a_directory_as_config_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "launch.yaml"
    path.mkdir()
    message = load_error(path)
    assert message.startswith(f"cannot read config file {path}: ")
    assert "Is a directory" in message


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "# nothing here yet\n", "---\n", "null\n", "\ufeff"],
    ids=["empty", "blank", "comment", "doc", "null", "bom"],
)
def test_empty_file_means_all_defaults_and_says_so(tmp_path: Path, text: str, capsys) -> None:
    # A warning, not an error: an empty file has one meaning (no settings, as no file at all),
    # and a file whose settings are all commented out is a common way to start over; the line
    # on stderr catches the other case, a file that was meant to hold settings.
    path = write(tmp_path / "launch.yaml", text)
    loaded = load_config(path)
    assert loaded.values == {}
    assert loaded.ignored == []
    assert capsys.readouterr().err == f"Warning: config file {path} is empty: every setting takes its default\n"


def test_a_file_with_settings_prints_no_warning(tmp_path: Path, capsys) -> None:
    load_config(write(tmp_path / "launch.yaml", "# two\nnum_processes: 2\n"))
    assert capsys.readouterr().err == ""


def test_empty_sections_are_allowed(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path / "launch.yaml", "fsdp_config: {}\ndeepspeed_config:\nnum_processes: 3\n"))
    assert typed(loaded.values) == typed({"num_processes": 3})


def test_yaml_1_1_no_is_read_as_the_string_no(tmp_path: Path) -> None:
    # Hand-written files often leave NO / no unquoted, which YAML 1.1 reads as false.
    loaded = load_config(write(tmp_path / "launch.yaml", "distributed_type: NO\nmixed_precision: no\n"))
    assert typed(loaded.values) == typed({"distributed_type": "NO", "mixed_precision": "no"})


# --- where the config is found -----------------------------------------------------------------


@pytest.fixture
def all_locations(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """A config file in every place find_config looks."""
    places = {
        "explicit": write(tmp_path / "explicit dir" / "mine.yaml", "num_processes: 1\n"),
        "named": write(tmp_path / "named.yaml", "num_processes: 2\n"),
        "own": write(tmp_path / "xdg" / "x" / "launch.yaml", "num_processes: 3\n"),
        "accelerate": write(tmp_path / "hf" / "accelerate" / "default_config.yaml", "num_processes: 4\n"),
    }
    monkeypatch.setenv("X_CONFIG_FILE", str(places["named"]))
    return places


def test_find_config_explicit_path_wins(all_locations: dict[str, Path]) -> None:
    assert find_config(all_locations["explicit"]) == (all_locations["explicit"], "--config_file")
    assert find_config(str(all_locations["explicit"])) == (all_locations["explicit"], "--config_file")


def test_find_config_x_config_file_beats_default_locations(all_locations: dict[str, Path]) -> None:
    assert find_config() == (all_locations["named"], "X_CONFIG_FILE")


def test_find_config_own_location_beats_accelerates(all_locations: dict[str, Path], monkeypatch) -> None:
    monkeypatch.delenv("X_CONFIG_FILE")
    assert default_config_path() == all_locations["own"]
    assert find_config() == (all_locations["own"], "default location")


def test_find_config_falls_back_to_accelerates_location(all_locations: dict[str, Path], monkeypatch) -> None:
    monkeypatch.delenv("X_CONFIG_FILE")
    all_locations["own"].unlink()
    assert accelerate_config_path() == all_locations["accelerate"]
    assert find_config() == (all_locations["accelerate"], "Accelerate's default location")


def test_find_config_none(all_locations: dict[str, Path], monkeypatch) -> None:
    monkeypatch.delenv("X_CONFIG_FILE")
    all_locations["own"].unlink()
    all_locations["accelerate"].unlink()
    assert find_config() == (None, "no config file")


def test_find_config_empty_x_config_file_counts_as_unset(all_locations: dict[str, Path], monkeypatch) -> None:
    monkeypatch.setenv("X_CONFIG_FILE", "  ")
    assert find_config() == (all_locations["own"], "default location")


def test_find_config_explicit_and_named_paths_need_not_exist_yet(tmp_path: Path, monkeypatch) -> None:
    missing = tmp_path / "missing.yaml"
    assert find_config(missing) == (missing, "--config_file")
    monkeypatch.setenv("X_CONFIG_FILE", str(missing))
    assert find_config() == (missing, "X_CONFIG_FILE")


def test_find_config_expands_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("X_CONFIG_FILE", "~/cfg/launch.yaml")
    assert find_config() == (tmp_path / "home" / "cfg" / "launch.yaml", "X_CONFIG_FILE")
    assert find_config("~/other.yaml") == (tmp_path / "home" / "other.yaml", "--config_file")


def test_find_config_skips_a_directory_at_a_default_location(tmp_path: Path) -> None:
    (tmp_path / "xdg" / "x" / "launch.yaml").mkdir(parents=True)
    accelerate = write(tmp_path / "hf" / "accelerate" / "default_config.yaml", "num_processes: 4\n")
    assert find_config() == (accelerate, "Accelerate's default location")


def test_default_locations_without_xdg_or_hf_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.delenv("HF_HOME")
    home = tmp_path / "home"
    assert default_config_path() == home / ".config" / "x" / "launch.yaml"
    assert accelerate_config_path() == home / ".cache" / "huggingface" / "accelerate" / "default_config.yaml"
    accelerate = write(accelerate_config_path(), "num_processes: 4\n")
    assert find_config() == (accelerate, "Accelerate's default location")
    own = write(default_config_path(), "num_processes: 3\n")
    assert find_config() == (own, "default location")


# --- writing ----------------------------------------------------------------------------------


def test_as_yaml_document_nests_section_keys() -> None:
    assert as_yaml_document(
        {"num_processes": 2, "fsdp_config.fsdp_version": 2, "fsdp_config.fsdp_offload_params": True}
    ) == {
        "num_processes": 2,
        "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": True},
    }


@pytest.mark.parametrize(
    "text", [MULTI_GPU, FSDP2, DEEPSPEED, DYNAMO_MULTI_NODE], ids=["multi-gpu", "fsdp", "ds", "dynamo"]
)
def test_save_then_load_round_trips_values(tmp_path: Path, text: str) -> None:
    original = load_config(write(tmp_path / "accelerate.yaml", text))
    target = tmp_path / "out" / "launch.yaml"
    save_config(target, original.values)
    again = load_config(target)
    assert typed(again.values) == typed(original.values)
    assert again.ignored == []
    document = yaml.safe_load(target.read_text())
    assert not any("." in key for key in document), document  # sections nested, not dotted
    for section in ("fsdp_config", "deepspeed_config", "dynamo_config"):
        subs = {k.partition(".")[2]: v for k, v in original.values.items() if k.startswith(section + ".")}
        assert document.get(section) == (subs or None)


def test_saved_yaml_keeps_no_as_a_string(tmp_path: Path) -> None:
    values = {"distributed_type": "NO", "mixed_precision": "no", "gpu_ids": "0", "main_process_port": 29500}
    target = tmp_path / "launch.yaml"
    save_config(target, values)
    assert yaml.safe_load(target.read_text()) == values  # readable by any YAML 1.1 reader
    assert typed(load_config(target).values) == typed(values)


def test_save_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    target = tmp_path / "launch.yaml"
    target.write_bytes(b"# my hand-tuned config\nnum_processes: 7\n")
    before = target.read_bytes()
    with pytest.raises(ConfigError) as info:
        save_config(target, {"num_processes": 1})
    assert str(info.value) == f"{target} already exists; pass --force to replace it"
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.yaml"]


def test_save_with_force_replaces(tmp_path: Path) -> None:
    target = tmp_path / "launch.yaml"
    target.write_text("num_processes: 7\n")
    save_config(target, {"num_processes": 1, "use_cpu": True}, force=True)
    assert yaml.safe_load(target.read_text()) == {"num_processes": 1, "use_cpu": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.yaml"]


def test_save_creates_parent_folders_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c" / "launch.yaml"
    save_config(target, {"num_processes": 2})
    assert yaml.safe_load(target.read_text()) == {"num_processes": 2}
    assert [p.name for p in target.parent.iterdir()] == ["launch.yaml"]


def test_save_failure_is_a_config_error_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    # The target is a non-empty directory: the final rename fails after the temporary file exists.
    target = tmp_path / "launch.yaml"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(ConfigError) as info:
        save_config(target, {"num_processes": 2}, force=True)
    assert str(info.value).startswith(f"cannot write {target}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.yaml"]
    assert (target / "keep").read_text() == "x"


def test_save_into_a_file_as_folder_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "x"
    blocker.write_text("not a folder")
    target = blocker / "launch.yaml"
    with pytest.raises(ConfigError) as info:
        save_config(target, {"num_processes": 2})
    assert str(info.value).startswith(f"cannot write {target}: ")
    assert blocker.read_text() == "not a folder"
