"""FSDP options without processes: the plugin read from the launcher, wrap units, refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from x_common import env
from x_runtime import Accelerator, FullyShardedDataParallelPlugin
from x_runtime.core.settings import Settings
from x_runtime.process.topology.environments import _default_backend
from x_runtime.strategies.fsdp import wrap_units
from x_runtime.strategies.fsdp_plugin import needs_cpu_collectives


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(10, 10)  # 110 parameters
        self.b = nn.Linear(10, 10)


class Model(nn.Module):
    _no_split_modules = ("Layer",)

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 10)  # 500 parameters
        self.layers = nn.ModuleList(Layer() for _ in range(3))
        self.head = nn.Linear(10, 2)  # 22 parameters


def _names(model: nn.Module, units: list[nn.Module]) -> list[str]:
    names = {id(m): n for n, m in model.named_modules()}
    return [names[id(u)] for u in units]


def test_plugin_takes_the_launchers_fsdp_config(monkeypatch) -> None:
    monkeypatch.setenv(env.FSDP_AUTO_WRAP_POLICY.name, "TRANSFORMER_BASED_WRAP")
    monkeypatch.setenv(env.FSDP_TRANSFORMER_CLS_TO_WRAP.name, "LlamaDecoderLayer,LlamaMLP")
    monkeypatch.setenv(env.FSDP_STATE_DICT_TYPE.name, "SHARDED_STATE_DICT")
    monkeypatch.setenv(env.FSDP_RESHARD_AFTER_FORWARD.name, "false")
    monkeypatch.setenv(env.FSDP_ACTIVATION_CHECKPOINTING.name, "true")
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.auto_wrap_policy == "transformer_based_wrap"
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer", "LlamaMLP"]
    assert (plugin.state_dict_type, plugin.reshard_after_forward, plugin.activation_checkpointing) == (
        "SHARDED_STATE_DICT",
        False,
        True,
    )
    # Arguments in code win over the launcher.
    assert FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT").state_dict_type == "FULL_STATE_DICT"


@pytest.mark.parametrize(("strategy", "reshard"), [("FULL_SHARD", True), ("SHARD_GRAD_OP", False)])
def test_fsdp1_sharding_strategies_translate_to_resharding(strategy, reshard) -> None:
    assert FullyShardedDataParallelPlugin(sharding_strategy=strategy).reshard_after_forward is reshard
    # Accelerate's files put the FSDP1 name under fsdp_reshard_after_forward.
    assert FullyShardedDataParallelPlugin(reshard_after_forward=strategy).reshard_after_forward is reshard


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sharding_strategy": "NO_SHARD"}, "sharding_strategy=NO_SHARD: fully_shard runs FULL_SHARD"),
        (
            {"sharding_strategy": "FULL_SHARD", "reshard_after_forward": False},
            "sharding_strategy=FULL_SHARD contradicts reshard_after_forward=False",
        ),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, "LOCAL_STATE_DICT exists only in FSDP1; use SHARDED_STATE_DICT"),
        ({"auto_wrap_policy": "by_magic"}, "auto_wrap_policy='by_magic' is not one of transformer_based_wrap"),
        (
            {"cpu_ram_efficient_loading": True, "sync_module_states": False},
            "cpu_ram_efficient_loading=True needs sync_module_states=True",
        ),
        ({"mixed_precision_policy": {"param_dtype": "fp12"}}, "param_dtype='fp12': expected one of"),
    ],
)
def test_contradictory_or_unknown_options_are_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        FullyShardedDataParallelPlugin(**kwargs).mixed_precision("no")


def test_mixed_precision_policy_follows_the_accelerator_and_reduces_in_fp32() -> None:
    policy = FullyShardedDataParallelPlugin().mixed_precision("bf16")
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert FullyShardedDataParallelPlugin().mixed_precision("no").param_dtype is None
    given = FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": "bf16", "reduce_dtype": "bf16"})
    assert given.mixed_precision("no").reduce_dtype == torch.bfloat16


def test_transformer_wrap_defaults_to_the_models_no_split_modules() -> None:
    model = Model()
    units = wrap_units(model, FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap"))
    assert _names(model, units) == ["layers.0", "layers.1", "layers.2"]


def test_set_auto_wrap_policy_settles_the_layer_classes_early_as_accelerate() -> None:
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    plugin.set_auto_wrap_policy(Model())
    assert plugin.transformer_cls_names_to_wrap == ["Layer"]
    plain = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    with pytest.raises(ValueError, match=r"Sequential declares no _no_split_modules"):
        plain.set_auto_wrap_policy(nn.Sequential(nn.Linear(2, 2)))
    sized = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=10)
    sized.set_auto_wrap_policy(Model())  # nothing to settle: units are found by size at prepare
    assert sized.transformer_cls_names_to_wrap is None


def test_size_wrap_groups_parameters_until_the_threshold() -> None:
    model = Model()
    units = wrap_units(model, FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=200))
    # Each Layer holds 220 parameters; the embedding 500; the head's 22 stay with the root.
    assert _names(model, units) == ["embed", "layers.0", "layers.1", "layers.2"]
    units = wrap_units(model, FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=600))
    assert _names(model, units) == ["layers"]


def test_unknown_layer_class_names_list_the_models_classes() -> None:
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap="Layer,DecoderLayer")
    with pytest.raises(ValueError) as caught:
        wrap_units(Model(), plugin)
    assert str(caught.value) == (
        "fsdp_transformer_layer_cls_to_wrap: DecoderLayer not found in Model; its module classes with parameters "
        "are Embedding, Layer, Linear, Model, ModuleList"
    )


def test_class_policy_without_names_on_a_plain_model_says_what_to_set() -> None:
    with pytest.raises(ValueError, match=r"needs layer class names .* Sequential declares no _no_split_modules"):
        wrap_units(
            nn.Sequential(nn.Linear(2, 2)), FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
        )


def test_plugin_contradicting_the_launcher_names_both(monkeypatch) -> None:
    monkeypatch.setenv(env.DISTRIBUTED_TYPE.name, "DEEPSPEED")
    with pytest.raises(
        ValueError, match=r"distributed_type=DEEPSPEED \(X_DISTRIBUTED_TYPE\) but the code passes fsdp_plugin"
    ):
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())


def test_fsdp_plugin_in_a_lone_process_is_refused_with_how_to_launch() -> None:
    with pytest.raises(ValueError, match="FSDP needs a process group, but this process was started alone"):
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())


def test_plugin_accepts_torch_fsdp_enums_and_numbers() -> None:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy, StateDictType

    from x_runtime.strategies.fsdp_plugin import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
        state_dict_type=StateDictType.SHARDED_STATE_DICT,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
    )
    assert (plugin.reshard_after_forward, plugin.state_dict_type, plugin.backward_prefetch) == (
        False,
        "SHARDED_STATE_DICT",
        "BACKWARD_PRE",
    )
    plugin = FullyShardedDataParallelPlugin(reshard_after_forward=ShardingStrategy.FULL_SHARD, state_dict_type=1)
    assert (plugin.reshard_after_forward, plugin.state_dict_type) == (True, "FULL_STATE_DICT")
    assert (
        FullyShardedDataParallelPlugin(sharding_strategy="ShardingStrategy.SHARD_GRAD_OP").reshard_after_forward
        is False
    )


@pytest.mark.parametrize(
    ("device", "cpu_collectives", "backend"),
    [
        ("cuda", False, "nccl"),
        ("cuda", True, "cuda:nccl,cpu:gloo"),
        ("xpu", True, "xpu:xccl,cpu:gloo"),
        ("cpu", True, "gloo"),
        ("cpu", False, "gloo"),
    ],
)
def test_the_default_backend_carries_cpu_tensors_when_fsdp_makes_them(device, cpu_collectives, backend) -> None:
    assert _default_backend(torch.device(device), cpu_collectives) == backend


@pytest.mark.parametrize(
    ("plugin", "variables", "needed"),
    [
        ({"cpu_offload": True, "state_dict_type": "SHARDED_STATE_DICT"}, {}, True),
        ({"cpu_offload": False, "state_dict_type": "FULL_STATE_DICT"}, {}, True),
        ({"cpu_offload": False, "state_dict_type": "SHARDED_STATE_DICT"}, {}, False),
        (None, {"FSDP_OFFLOAD_PARAMS": "true", "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"}, True),
        (None, {"FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"}, False),
        (None, {}, True),  # x's default state dict type is FULL_STATE_DICT
    ],
)
def test_fsdp_makes_cpu_collectives_with_offload_or_full_state_dicts(monkeypatch, plugin, variables, needed) -> None:
    for name in ("FSDP_OFFLOAD_PARAMS", "FSDP_STATE_DICT_TYPE"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(getattr(env, name).name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(getattr(env, name).name, value)
    given = None if plugin is None else FullyShardedDataParallelPlugin(**plugin)
    assert needs_cpu_collectives(given, Settings.read()) is needed
