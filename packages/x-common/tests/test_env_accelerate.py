"""The runtime reads what ``accelerate launch`` sets when no ``X_*`` variable says otherwise."""

from __future__ import annotations

import pytest

from x_common import env
from x_common.env import read_contract

# What accelerate 1.15's `accelerate launch --use_fsdp --fsdp_version 2 --mixed_precision bf16
# --gradient_accumulation_steps 4 --dynamo_backend inductor ...` puts in the environment
# (utils/launch.py, prepare_multi_gpu_env), spellings included.
ACCELERATE_FSDP2 = {
    "ACCELERATE_USE_CPU": "False",
    "ACCELERATE_MIXED_PRECISION": "bf16",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4",
    "ACCELERATE_DEBUG_MODE": "true",
    "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR",
    "ACCELERATE_DYNAMO_MODE": "max-autotune",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": "True",
    "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_SHARDING_STRATEGY": "FULL_SHARD",  # always written; FSDP2 ignores it
    "FSDP_RESHARD_AFTER_FORWARD": "false",
    "FSDP_OFFLOAD_PARAMS": "true",
    "FSDP_MIN_NUM_PARAMS": "100000000",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer,LlamaMLP",
    "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
    "FSDP_FORWARD_PREFETCH": "false",
    "FSDP_USE_ORIG_PARAMS": "true",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
    "FSDP_SYNC_MODULE_STATES": "true",
    "FSDP_ACTIVATION_CHECKPOINTING": "true",
}


def test_an_accelerate_fsdp2_launch_reads_as_configured() -> None:
    values = read_contract(ACCELERATE_FSDP2)
    assert {name: values[var.name] for name, var in _vars().items()} == {
        "DISTRIBUTED_TYPE": "FSDP",
        "MIXED_PRECISION": "bf16",
        "USE_CPU": False,
        "GRADIENT_ACCUMULATION_STEPS": 4,
        "DEBUG_MODE": True,
        "DYNAMO_BACKEND": "inductor",
        "DYNAMO_MODE": "max-autotune",
        "DYNAMO_FULLGRAPH": True,
        "DYNAMO_DYNAMIC": False,
        "DYNAMO_REGIONAL": False,
        "FSDP_VERSION": 2,
        "FSDP_RESHARD_AFTER_FORWARD": False,
        "FSDP_SHARDING_STRATEGY": "FULL_SHARD",  # the default: not read from Accelerate under FSDP2
        "FSDP_OFFLOAD_PARAMS": True,
        "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": ("LlamaDecoderLayer", "LlamaMLP"),
        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": True,
        "FSDP_SYNC_MODULE_STATES": True,
        "FSDP_USE_ORIG_PARAMS": True,
        "FSDP_ACTIVATION_CHECKPOINTING": True,
    }
    assert not env.FSDP_SHARDING_STRATEGY.is_set(ACCELERATE_FSDP2)  # so the runtime keeps reshard=False


def _vars() -> dict[str, env.EnvVar]:
    names = (
        "DISTRIBUTED_TYPE MIXED_PRECISION USE_CPU GRADIENT_ACCUMULATION_STEPS DEBUG_MODE DYNAMO_BACKEND DYNAMO_MODE "
        "DYNAMO_FULLGRAPH DYNAMO_DYNAMIC DYNAMO_REGIONAL FSDP_VERSION FSDP_RESHARD_AFTER_FORWARD FSDP_SHARDING_STRATEGY "
        "FSDP_OFFLOAD_PARAMS FSDP_AUTO_WRAP_POLICY FSDP_TRANSFORMER_CLS_TO_WRAP FSDP_STATE_DICT_TYPE "
        "FSDP_CPU_RAM_EFFICIENT_LOADING FSDP_SYNC_MODULE_STATES FSDP_USE_ORIG_PARAMS FSDP_ACTIVATION_CHECKPOINTING"
    )
    return {name: getattr(env, name) for name in names.split()}


def test_x_variables_win_over_accelerates() -> None:
    environ = {**ACCELERATE_FSDP2, "X_MIXED_PRECISION": "fp16", "X_DISTRIBUTED_TYPE": "MULTI_GPU"}
    assert env.MIXED_PRECISION.read(environ) == "fp16"
    assert env.DISTRIBUTED_TYPE.read(environ) == "MULTI_GPU"
    assert env.GRADIENT_ACCUMULATION_STEPS.read({**environ, "X_GRADIENT_ACCUMULATION_STEPS": "2"}) == 2


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"ACCELERATE_USE_FSDP": "true"}, "FSDP"),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DEEPSPEED"),
        ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_FSDP": "true"}, "DEEPSPEED"),  # as state.py
        ({"ACCELERATE_USE_FSDP": "false"}, None),
        ({"ACCELERATE_USE_DEEPSPEED": "False", "ACCELERATE_USE_FSDP": "True"}, "FSDP"),
        ({}, None),
    ],
)
def test_distributed_type_derives_from_accelerates_switches(environ: dict[str, str], expected: str | None) -> None:
    assert env.DISTRIBUTED_TYPE.read(environ) == expected


def test_fsdp1_spellings_strategy_names_and_torch_numbers() -> None:
    fsdp1 = {"FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "2", "FSDP_RESHARD_AFTER_FORWARD": "true"}
    assert env.FSDP_SHARDING_STRATEGY.read(fsdp1) == "SHARD_GRAD_OP"
    # Accelerate lower-cases an FSDP1 strategy written into reshard_after_forward; it names the strategy
    assert env.FSDP_SHARDING_STRATEGY.read({**fsdp1, "FSDP_RESHARD_AFTER_FORWARD": "hybrid_shard"}) == "HYBRID_SHARD"
    assert env.FSDP_RESHARD_AFTER_FORWARD.read({"FSDP_RESHARD_AFTER_FORWARD": "shard_grad_op"}) is True  # default
    assert env.FSDP_STATE_DICT_TYPE.read({"FSDP_STATE_DICT_TYPE": "2"}) == "LOCAL_STATE_DICT"  # Accelerate's order
    assert env.FSDP_BACKWARD_PREFETCH.read({"FSDP_BACKWARD_PREFETCH": "2"}) == "BACKWARD_POST"
    assert env.FSDP_AUTO_WRAP_POLICY.read({"FSDP_AUTO_WRAP_POLICY": "size_based_wrap"}) == "SIZE_BASED_WRAP"


def test_deepspeed_variables_and_accelerates_none() -> None:
    environ = {
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "auto",  # DeepSpeed's config decides: unset here
        "ACCELERATE_GRADIENT_CLIPPING": "none",  # str(None).lower()
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": "None",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
    }
    values = read_contract(environ)
    assert values[env.DISTRIBUTED_TYPE.name] == "DEEPSPEED"
    assert values[env.DEEPSPEED_ZERO_STAGE.name] == 3
    assert values[env.GRADIENT_ACCUMULATION_STEPS.name] == 1
    assert values[env.DEEPSPEED_GRADIENT_CLIPPING.name] is None
    assert values[env.DEEPSPEED_CONFIG_FILE.name] is None and not env.DEEPSPEED_CONFIG_FILE.is_set(environ)
    assert values[env.DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE.name] == "cpu"
    assert values[env.DEEPSPEED_ZERO3_INIT.name] is True


def test_a_malformed_accelerate_value_names_accelerates_variable() -> None:
    with pytest.raises(ValueError, match=r"^ACCELERATE_MIXED_PRECISION='bf32' is not valid: expected one of"):
        env.MIXED_PRECISION.read({"ACCELERATE_MIXED_PRECISION": "bf32"})


def test_every_fallback_is_a_name_accelerate_writes() -> None:
    names = {fallback.name for var in env.CONTRACT for fallback in var.fallbacks}
    assert all(name.startswith(("ACCELERATE_", "FSDP_")) for name in names)
    assert {"ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU", "ACCELERATE_USE_FSDP", "FSDP_VERSION"} <= names
